"""Alembic migrations of the skillstate schema (installed as skillstate.migrations)."""
