"""The tables of a skillstate database, as SQLAlchemy Core metadata.

The schema itself is created and upgraded only by the Alembic migrations in
`skillstate.migrations`; these definitions are what the store queries and
what `skillstate db check` compares a database against.
"""

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

runs = Table(
    "runs", metadata,
    Column("run_id", String(128), primary_key=True),
    Column("parent_run_id", String(128), ForeignKey("runs.run_id"), nullable=True),
    Column("fork_step", Integer, nullable=True),
    Column("kind", String(32), nullable=False, server_default="train"),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

events = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(128), ForeignKey("runs.run_id"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("payload", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("mac", String(64), nullable=True),  # HMAC of `hash` under $SKILLSTATE_AUDIT_KEY, if set when written
    UniqueConstraint("run_id", "seq", name="uq_events_run_seq"),
)

blobs = Table(
    "blobs", metadata,
    Column("hash", String(64), primary_key=True),
    Column("size", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
)

llm_calls = Table(
    "llm_calls", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(128), nullable=False),
    Column("role", String(32), nullable=False),
    Column("request_hash", String(64), nullable=False),
    Column("model", String(256), nullable=False),
    Column("request", Text, nullable=False),
    Column("response", Text, nullable=True),
    Column("prompt_tokens", Integer, nullable=False, server_default="0"),
    Column("completion_tokens", Integer, nullable=False, server_default="0"),
    Column("latency_ms", Float, nullable=False, server_default="0"),
    Column("error", Text, nullable=True),
    Column("ok", Boolean, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
Index("ix_llm_calls_request_hash", llm_calls.c.request_hash)

run_leases = Table(
    "run_leases", metadata,
    Column("run_id", String(128), primary_key=True),
    Column("holder", String(256), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)
Index("ix_llm_calls_run_id", llm_calls.c.run_id)
