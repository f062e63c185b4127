"""Schema management through Alembic, usable from the installed package.

The migration scripts ship inside the package (`skillstate.migrations`), so
`pip install skillstate` can create and upgrade a database without a checkout
or an alembic.ini. Before anything is created or upgraded, the database is
inspected (`inspect_schema`): someone else's database, a skillstate schema
without its version table and a schema missing tables or columns are refused
with one line naming the problem, and nothing is written.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from skillstate.errors import NotFoundError, UserError
from skillstate.storage.schema import metadata, run_leases

if TYPE_CHECKING:  # Alembic is imported where a schema is created, upgraded or older than HEAD_REVISION
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# The newest migration's revision, which a database opened every day has: one that records it is checked
# against `metadata` without loading Alembic and its scripts (tests/test_store.py holds this to the scripts).
HEAD_REVISION = "0003"


class SchemaError(UserError):
    """The database is not a usable skillstate database: someone else's, damaged or unversioned."""


class DatabaseProblem(UserError):
    """The database cannot be used: missing, not a database, malformed, read-only."""


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    # by name: setuptools maps skillstate.migrations to migrations/, which mypy cannot see (pyproject [tool.mypy])
    migrations = importlib.import_module("skillstate.migrations")
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(str(migrations.__file__)).parent).replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    # cast: the shipped migrations have exactly one head (get_current_head is None only without any)
    return cast(str, _scripts().get_current_head())


def _revision_of(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return _revision_of(conn)


# What each migration after the first adds (tables, or table.column): a schema at an older
# revision is checked without them. Add a line here with every new migration, and move HEAD_REVISION to it.
ADDED_BY = {"0002": ("run_leases", "events.mac")}
VERSION_TABLE = "alembic_version"


@dataclass(frozen=True)
class SchemaReport:
    """What `inspect_schema` found. `state` is one of: empty, ok, outdated
    (an older revision, upgraded on open), foreign (someone else's tables),
    unversioned (skillstate tables without alembic_version), damaged (tables
    or columns missing), newer (a revision this skillstate does not know)."""

    url: str
    state: str
    revision: str | None = None
    tables: tuple[str, ...] = field(default=())
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _expected(revision: str, script: ScriptDirectory) -> tuple[set[str], set[str]]:
    """The tables and table.column names the schema has at `revision`."""
    later = {r.revision for r in script.iterate_revisions(script.get_current_head(), revision)} - {revision}
    skip = {name for rev in later for name in ADDED_BY.get(rev, ())}
    tables = {t for t in metadata.tables if t not in skip}
    return tables, _columns(tables) - skip


def inspect_schema(engine: Engine) -> SchemaReport:
    """Compare the database's tables and columns with skillstate's
    (`skillstate.storage.schema.metadata` at the recorded revision), reading only."""
    shown = engine.url.render_as_string(hide_password=True)
    with engine.connect() as conn:
        insp = inspect(conn)
        tables = set(insp.get_table_names())
        ours = tables & set(metadata.tables)
        listed = tuple(sorted(tables))
        if not tables:
            return SchemaReport(shown, "empty")
        if VERSION_TABLE in tables and ours == set(metadata.tables):
            versions = [r[0] for r in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))]
            if versions == [HEAD_REVISION]:  # the usual case: no scripts to read
                return _report(shown, insp, HEAD_REVISION, set(metadata.tables), _columns(set(metadata.tables)),
                               tables, "ok")
        script = _scripts()
        # Ours is a file with skillstate's version (a revision it knows) or its whole first schema; a table
        # merely named like one of ours (another program's `runs`) makes it someone else's, not a damaged one.
        if VERSION_TABLE not in tables:
            if not _whole_first_schema(insp, tables, script):
                return SchemaReport(shown, "foreign", tables=listed, problem=_foreign(shown, listed, ours))
            return SchemaReport(shown, "unversioned", tables=listed, problem=(
                f"the skillstate schema in {shown} is damaged: it has skillstate tables ({', '.join(sorted(ours))}) "
                f"but no {VERSION_TABLE} table, so its revision is unknown; restore it from a backup or "
                "use another --db"))
        revision = _revision_of(conn)
        if revision is None or not _known(script, revision):
            if not _whole_first_schema(insp, tables, script):
                return SchemaReport(shown, "foreign", revision, listed, _foreign(shown, listed, ours))
            if revision is not None:
                return SchemaReport(shown, "newer", revision, listed,
                                    f"database schema revision {revision} of {shown} is newer than this "
                                    "skillstate; upgrade skillstate")
            return SchemaReport(shown, "unversioned", None, listed,
                                f"the skillstate schema in {shown} is damaged: its {VERSION_TABLE} table holds "
                                "no revision; restore it from a backup or use another --db")
        want_tables, want_columns = _expected(revision, script)
        state = "ok" if revision == script.get_current_head() else "outdated"
        return _report(shown, insp, revision, want_tables, want_columns, tables, state)


def _columns(tables: set[str]) -> set[str]:
    """The table.column names of `tables` in skillstate's schema now."""
    return {f"{t}.{c.name}" for t in tables for c in metadata.tables[t].columns}


def _report(shown: str, insp: Any, revision: str, want_tables: set[str], want_columns: set[str],
            tables: set[str], state: str) -> SchemaReport:
    """The report of a schema at a known `revision`: `state` when it has the tables and columns it should."""
    listed = tuple(sorted(tables))
    missing = sorted(want_tables - tables)
    if not missing:  # then the columns of every table
        have = {f"{t}.{c['name']}" for t in want_tables for c in insp.get_columns(t)}
        missing = sorted(want_columns - have)
    if missing:
        kind = "table" if "." not in missing[0] else "column"
        what = f"{kind}s {', '.join(missing)} are" if len(missing) > 1 else f"{kind} {missing[0]} is"
        return SchemaReport(shown, "damaged", revision, listed,
                            f"the skillstate schema in {shown} (revision {revision}) is damaged: {what} "
                            "missing; restore it from a backup or use another --db")
    return SchemaReport(shown, state, revision, listed)


def _known(script: ScriptDirectory, revision: str) -> bool:
    try:
        return script.get_revision(revision) is not None
    except Exception:  # an id alembic cannot resolve: another application's revision
        return False


def _whole_first_schema(insp: Any, tables: set[str], script: ScriptDirectory) -> bool:
    """Whether the database has every table and column of skillstate's first revision."""
    base = script.get_base()
    if base is None:
        return False
    want_tables, want_columns = _expected(base, script)
    if not want_tables <= tables:
        return False
    have = {f"{t}.{c['name']}" for t in want_tables for c in insp.get_columns(t)}
    return want_columns <= have


def _foreign(shown: str, tables: tuple[str, ...], lookalike: set[str] | None = None) -> str:
    names = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    alike = (f"; {' and '.join(sorted(lookalike))} only {'shares' if len(lookalike) == 1 else 'share'} a name "
             "with skillstate's: the file has neither skillstate's version table nor its schema") if lookalike else ""
    return (f"{shown} is not a skillstate database (it has other tables: {names}{alike}); nothing was changed. "
            "Use another --db")


def file_problem(engine: Engine) -> str | None:
    """SQLite's own check of every page (`PRAGMA quick_check`: reads the
    whole file, about 0.1 s per 100 MB; `skillstate db check` runs it, and so
    does every open for writing, `check_file_intact`); None when the file is
    intact."""
    if engine.dialect.name != "sqlite":
        return None
    with engine.connect() as conn:
        result = [row[0] for row in conn.exec_driver_sql("PRAGMA quick_check(3)")]
    if result == ["ok"]:
        return None
    shown = engine.url.render_as_string(hide_password=True)
    found = [line.strip() for r in result for line in str(r).splitlines()
             if line.strip() and not line.startswith("*** in database")]  # one line: SQLite's findings, joined
    return f"the database file of {shown} is damaged: {'; '.join(found)[:500]}"


def check_file_intact(engine: Engine) -> None:
    """Refuse to write into a SQLite file whose pages are corrupted (what
    `skillstate db check` finds): `file_problem`, run when a database is
    opened for writing."""
    problem = file_problem(engine)
    if problem:
        raise DatabaseProblem(f"{problem}; nothing was written (restore it from a backup, or copy the runs "
                              "that still read with `skillstate db copy`)")


def check_schema(engine: Engine, *, create: bool = True) -> SchemaReport:
    """The report of a database that skillstate may use; raises SchemaError
    for a foreign, damaged, unversioned or newer schema, and NotFoundError
    for an empty database unless `create`."""
    report = inspect_schema(engine)
    if report.problem:
        raise SchemaError(report.problem)
    if report.state == "empty" and not create:
        raise NotFoundError(f"{report.url} is an empty database: no skillstate schema and no runs yet; "
                            "start one with `skillstate run`")
    return report


# Any fixed number: the PostgreSQL advisory lock that serializes migrations.
_MIGRATION_LOCK = 0x5C111_57A7E


def ensure_schema(engine: Engine, *, create: bool = True) -> bool:
    """Check the schema (see `check_schema`), then upgrade it to head if
    needed; returns True if a migration ran. Without `create` an empty
    database is refused rather than given the schema.

    Several processes may open a new database at once: the migration runs
    under a lock (an advisory lock on PostgreSQL, a write transaction on
    SQLite), and whoever gets it second finds the schema already there."""
    report = check_schema(engine, create=create)
    if report.state == "ok":
        return False
    head = head_revision()
    if engine.dialect.name == "sqlite":
        return _upgrade_sqlite(engine, head)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        if _revision_of(conn) == head:
            return False
        _upgrade(conn)
    return True


def _upgrade(conn: Connection) -> None:
    from alembic import command

    command.upgrade(alembic_config(conn), "head")


def _upgrade_sqlite(engine: Engine, head: str) -> bool:
    """The whole migration in one BEGIN IMMEDIATE transaction (SQLite's DDL is
    transactional), so a second process waits for it and then skips it."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            if _revision_of(conn) == head:
                conn.exec_driver_sql("ROLLBACK")
                return False
            _upgrade(conn)
        except BaseException:
            conn.exec_driver_sql("ROLLBACK")
            raise
        conn.exec_driver_sql("COMMIT")
        switch_to_wal(conn.exec_driver_sql)  # (outside a transaction; it stays with the file)
    return True


def switch_to_wal(execute: Callable[[str], Any]) -> None:
    """Put a SQLite file in WAL mode. The switch needs the file to itself and
    SQLite does not wait for that (no busy timeout), so while another process
    is in it, try again for a few seconds; failing that, the file stays as it
    is and the next connection tries again (WAL only makes it faster)."""
    for attempt in range(60):
        try:
            execute("PRAGMA journal_mode=WAL")
            return
        except Exception as err:  # sqlite3 or SQLAlchemy's OperationalError: "database is locked"
            if "locked" not in str(err) and "busy" not in str(err):
                raise
            time.sleep(0.02 * min(attempt + 1, 10))


# --- opening a database --------------------------------------------------------------------------------------


def sqlite_file(url: str) -> str | None:
    """The file path of a SQLite URL (also in its `file:` URI form), else None."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    path = parsed.database
    if path.startswith("file:"):
        path = path[len("file:"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else path


def require_database_file(url: str) -> None:
    """Refuse a SQLite database whose file does not exist (reading must not create it)."""
    path = sqlite_file(url)
    if path is not None and not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise DatabaseProblem(f"no database at {path}: the file {what} (check --db or $SKILLSTATE_DB)")


def ensure_wal(engine: Engine) -> None:
    """Put a skillstate SQLite file that is not in WAL mode yet into it. Only
    a process about to write calls this (after the schema check said the file
    is ours): reading never changes a file's journal mode, and someone
    else's file is never touched."""
    if engine.dialect.name != "sqlite":
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower() != "wal":
            switch_to_wal(conn.exec_driver_sql)


def raise_if_damaged(engine: Engine, error: BaseException | None) -> None:
    """Raise DatabaseProblem for a SQLite error that means the file itself is
    not a database or is corrupt (the engine's handle_error hook)."""
    reason = str(error or "").strip().splitlines()[0] if str(error or "").strip() else ""
    if reason in ("file is not a database", "database disk image is malformed"):
        shown = engine.url.render_as_string(hide_password=True)
        raise DatabaseProblem(f"cannot use database {shown}: {reason}") from None


def check_writable(engine: Engine) -> None:
    """Refuse a database this process cannot write to, before anything is
    computed: a DELETE that matches no row still needs write access."""
    shown = engine.url.render_as_string(hide_password=True)
    try:
        with engine.connect() as conn, conn.begin() as tx:
            conn.execute(run_leases.delete().where(run_leases.c.run_id.is_(None)))
            tx.rollback()
    except SQLAlchemyError as err:
        reason = db_reason(err)
        if "readonly" in reason.lower().replace("-", "").replace(" ", ""):
            raise DatabaseProblem(f"database {shown} is read-only: {reason}") from None
        raise DatabaseProblem(f"cannot write to database {shown}: {reason}") from None


def db_reason(err: SQLAlchemyError) -> str:
    """The first line of the driver's message, credentials masked."""
    from skillstate.config import redact

    reason = redact(str(getattr(err, "orig", None) or err).strip().splitlines()[0])
    if "timeout expired" in reason:  # a server that takes the connection and never answers
        reason += (" (no answer within the connect timeout: set ?connect_timeout=SECONDS in the URL or "
                   "$SKILLSTATE_DB_CONNECT_TIMEOUT to wait longer)")
    return reason
