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


def ensure_schema(engine: Engine) -> bool:
    """Upgrade to head if needed; returns True if a migration ran."""
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    current = current_revision(engine)
    if current == head:
        return False
    if current is not None and script.get_revision(current) is None:
        raise UserError(f"database schema revision {current} is newer than this skillstate; upgrade skillstate")
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    return True
