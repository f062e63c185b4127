"""Storage: the SQL event log on disk.

The table layout (schema), the append-only store with its hash chain (store,
chain), the journal of every LLM call (call_journal), run leases (lease), the
glue to the Alembic migrations (migrate) and the walk over content-addressed
blobs (blob_walk). This package may import skillstate.log (to encode and
decode events), skillstate.errors, skillstate.util and skillstate.config; it
never imports the engine, an LLM backend or anything that reads a run for
people.
"""
