"""The dashboard's read-only view of a database: it opens the store so that no
statement can write (SQLite `query_only`, a PostgreSQL session of read-only
transactions), refuses a schema it would have to upgrade, and keeps each
run's folded log until the run grows."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError

from skillstate.engine.loading import LoadedRun, load_run
from skillstate.errors import CorruptLogError, UserError
from skillstate.log.reducer import fold
from skillstate.storage.chain import check_chain
from skillstate.storage.store import Store

# Folded runs kept in memory, most recently used last.
MAX_CACHED_RUNS = 64
T = TypeVar("T")


def open_read_only(url: str) -> Store:
    """The store at `url`, through connections that refuse every write."""
    from skillstate.storage.migrate import DatabaseProblem, check_schema, db_reason, require_database_file

    require_database_file(url)
    store = Store(url, upgrade=False)

    @event.listens_for(store.engine, "connect")
    def _read_only(dbapi_conn, _record):  # after the store's own connect hook (its pragmas)
        cur = dbapi_conn.cursor()
        if store.engine.dialect.name == "sqlite":
            cur.execute("PRAGMA query_only = ON")
        else:
            cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        cur.close()
        if store.engine.dialect.name != "sqlite":
            dbapi_conn.commit()

    try:
        report = check_schema(store.engine, create=False)
    except SQLAlchemyError as err:
        store.close()
        raise DatabaseProblem(f"cannot open database {store.display_url}: {db_reason(err)}") from None
    except BaseException:
        store.close()
        raise
    if report.state != "ok":
        store.close()
        raise UserError(f"the database {store.display_url} has an older schema ({report.state}); the dashboard "
                        "never writes, so upgrade it first: skillstate db upgrade")
    return store


class RunCache:
    """Folded runs, each brought up to date by folding only the events
    appended since it was last read (checked against the hash chain like the
    rest: contiguous, linked, unaltered); and what pages computed from each
    version of a run. A fork's inherited prefix never changes, so a run's
    version is its own last sequence number."""

    def __init__(self, store: Store):
        self.store = store
        self._runs: OrderedDict[str, LoadedRun] = OrderedDict()
        self._memo: OrderedDict[tuple[str, str, int], Any] = OrderedDict()
        self._lock = threading.Lock()

    def version(self, run_id: str) -> int:
        return self.store.last_seq(run_id)

    def get(self, run_id: str) -> LoadedRun:
        with self._lock:
            hit = self._runs.get(run_id)
        loaded = self._update(hit) if hit is not None else load_run(self.store, run_id)
        with self._lock:
            self._runs[run_id] = loaded
            self._runs.move_to_end(run_id)
            while len(self._runs) > MAX_CACHED_RUNS:
                self._runs.popitem(last=False)
        return loaded

    def _update(self, loaded: LoadedRun) -> LoadedRun:
        seq, last_hash = loaded.log_position
        new = self.store.read_events(loaded.run_id, after=seq)
        if not new:
            return loaded
        decoded, problem = check_chain(new, last_hash, key=self.store.audit_key, first_seq=seq + 1)
        if problem:
            raise CorruptLogError(f"{problem}; the log of run {loaded.run_id} is damaged")
        try:
            state = fold(decoded, loaded.state)
        except Exception as err:
            raise CorruptLogError(f"run {loaded.run_id}: the log cannot be folded: {err}") from None
        return LoadedRun(loaded.run_id, loaded.lineage + new, loaded.own + new, state)

    def memo(self, run_id: str, what: str, compute: Callable[[LoadedRun], T]) -> T:
        """`compute(run)` for the run's current version, computed once per version."""
        loaded = self.get(run_id)
        key = (run_id, what, loaded.log_position[0])
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
        value = compute(loaded)
        with self._lock:
            self._memo[key] = value
            while len(self._memo) > 4 * MAX_CACHED_RUNS:
                self._memo.popitem(last=False)
        return value
