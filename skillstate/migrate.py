"""Schema management through Alembic, usable from the installed package.

The migration scripts ship inside the package (`skillstate.migrations`), so
`pip install skillstate` can create and upgrade a database without a checkout
or an alembic.ini.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from skillstate.errors import UserError


def alembic_config(connection: Connection | None = None) -> Config:
    from skillstate import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent).replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


# Any fixed number: the PostgreSQL advisory lock that serializes migrations.
_MIGRATION_LOCK = 0x5C111_57A7E


def ensure_schema(engine: Engine) -> bool:
    """Upgrade to head if needed; returns True if a migration ran.

    Several processes may open a new database at once: the migration runs
    under a lock (an advisory lock on PostgreSQL, a write transaction on
    SQLite), and whoever gets it second finds the schema already there."""
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    current = current_revision(engine)
    if current == head:
        return False
    if current is not None and script.get_revision(current) is None:
        raise UserError(f"database schema revision {current} is newer than this skillstate; upgrade skillstate")
    if engine.dialect.name == "sqlite":
        return _upgrade_sqlite(engine, head)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        if MigrationContext.configure(conn).get_current_revision() == head:
            return False
        command.upgrade(alembic_config(conn), "head")
    return True


def _upgrade_sqlite(engine: Engine, head: str) -> bool:
    """The whole migration in one BEGIN IMMEDIATE transaction (SQLite's DDL is
    transactional), so a second process waits for it and then skips it."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            if MigrationContext.configure(conn).get_current_revision() == head:
                conn.exec_driver_sql("ROLLBACK")
                return False
            command.upgrade(alembic_config(conn), "head")
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")
    return True
