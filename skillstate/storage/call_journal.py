"""The LLM call journal: every request sent and its reply (or error),
by request hash. A request already answered is served from here instead of
sent again, and verify reads the outcome an event saw as of its time.

Calls recorded at the same moment share one transaction (group commit);
each caller returns only once its row is committed. `Store` holds the
journal as a mixin, over its engine and write lock.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, insert, select, text
from sqlalchemy.engine import Engine

from skillstate.storage.call_index import hash_key
from skillstate.storage.schema import llm_calls
from skillstate.util import canonical_json, redact


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class CallRow:
    request_hash: str
    response: dict[str, Any] | None
    error: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class CallRecord:
    id: int
    role: str
    request_hash: str
    error: str | None
    created_at: dt.datetime


# The statements of the hot paths, built once: building a SQLAlchemy statement
# and its cache key costs more than SQLite takes to run it. Values are bound
# at execution, so the SQL sent is the same as a statement built per call.
_CALL_COLUMNS = (llm_calls.c.request_hash, llm_calls.c.response, llm_calls.c.error, llm_calls.c.prompt_tokens,
                 llm_calls.c.completion_tokens)
_CALL_BY_HASH = select(*_CALL_COLUMNS).where(llm_calls.c.request_hash == bindparam("request_hash"))
_CALL_IN_RUNS = _CALL_BY_HASH.where(llm_calls.c.run_id.in_(bindparam("run_ids", expanding=True)))
_FIRST_OK = {scoped: query.where(llm_calls.c.ok.is_(True)).order_by(llm_calls.c.id).limit(1)
             for scoped, query in ((False, _CALL_BY_HASH), (True, _CALL_IN_RUNS))}
_AS_OF = {scoped: query.where(llm_calls.c.created_at <= bindparam("as_of")).order_by(llm_calls.c.id)
          for scoped, query in ((False, _CALL_BY_HASH), (True, _CALL_IN_RUNS))}
_INSERT_CALL = insert(llm_calls)
# The first successful call of each of a batch's requests, in any run or in the given runs.
_FIRST_IDS = (select(func.min(llm_calls.c.id))
              .where(llm_calls.c.ok.is_(True), llm_calls.c.request_hash.in_(bindparam("hashes", expanding=True)))
              .group_by(llm_calls.c.request_hash))
_FIRST_OK_OF = {scoped: select(*_CALL_COLUMNS).where(llm_calls.c.id.in_(
    _FIRST_IDS.where(llm_calls.c.run_id.in_(bindparam("run_ids", expanding=True))) if scoped else _FIRST_IDS))
    for scoped in (False, True)}
# Before a batch checks its requests, it takes the write lock: on PostgreSQL a transaction-scoped lock per
# request, in key order (so never a deadlock), in a READ COMMITTED transaction (a statement sees what was
# committed before it began; the store's engine asks for that level whatever the server's default); on
# SQLite the database's (a write that changes nothing). Two processes journaling the same request at once
# then do it one after the other, and the second one's check sees the first one's row.
_LOCK_KEYS = text("SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) AS k")
_SQLITE_WRITE_LOCK = text("UPDATE llm_calls SET id = id WHERE 0 = 1")


class _PendingCall:
    """A call row waiting for its batch to be committed. When `check`ed: the
    first successful call of its request in `scope` (run ids, or None for any
    run) as of the commit, when this call failed or that call's reply is
    another (`first`)."""

    __slots__ = ("row", "done", "error", "check", "scope", "first", "failure")

    def __init__(self, row: dict[str, Any], check: bool = False, scope: list[str] | None = None):
        self.row = row
        self.done = False
        self.error: Exception | None = None
        self.check, self.scope = check, scope
        self.failure = row["error"]  # the call's own error (the row's may be marked SUPERSEDED, per attempt)
        self.first: CallRow | None = None


def _lock_key(request_hash: str) -> int:
    """A request's advisory lock key: its index key, as PostgreSQL's signed bigint."""
    return hash_key(request_hash) - (1 << 63)


def _first_ok_rows(conn: Any, hashes: list[str], run_ids: list[str] | None) -> dict[str, Any]:
    """Request hash -> the row of its first successful call (in `run_ids`,
    or in any run), for those of `hashes` that have one; 500 hashes a
    statement (SQLite before 3.32 binds at most 999 values to one)."""
    ordered = sorted(set(hashes))
    found: dict[str, Any] = {}
    for start in range(0, len(ordered), 500):
        params: dict[str, Any] = {"hashes": ordered[start:start + 500]}
        if run_ids is not None:
            params["run_ids"] = list(run_ids)
        found.update((row[0], row) for row in conn.execute(_FIRST_OK_OF[run_ids is not None], params).all())
    return found


def _first_calls(conn: Any, batch: list[_PendingCall]) -> None:
    """Set `first` on each checked row of `batch` about to be inserted: the
    first successful call of its request in its scope, if there is one and
    (for a successful row) its reply is another. That call is in the journal
    (one query per scope, in the batch's transaction once it holds the
    locks) or, failing that, an earlier row of this batch (the rows get their
    ids in batch order): two clients of one store may record the same
    request in one commit."""
    by_scope: dict[tuple[str, ...] | None, list[_PendingCall]] = {}
    for p in batch:
        if p.check:
            by_scope.setdefault(None if p.scope is None else tuple(p.scope), []).append(p)
    found: dict[int, Any] = {}  # id(pending row) -> the journal's first successful call of its request
    for scope, pending in by_scope.items():
        first = _first_ok_rows(conn, [p.row["request_hash"] for p in pending], None if scope is None else list(scope))
        for p in pending:
            found[id(p)] = first.get(p.row["request_hash"])
    earlier: dict[str, list[dict[str, Any]]] = {}  # request hash -> this batch's successful rows so far
    for p in batch:
        if p.check:  # (set anew: a batch interrupted before its commit is written again)
            row = found[id(p)]
            if row is None:
                before = next((r for r in earlier.get(p.row["request_hash"], ())
                               if p.scope is None or r["run_id"] in p.scope), None)
                if before is not None:
                    row = (before["request_hash"], before["response"], before["error"], before["prompt_tokens"],
                           before["completion_tokens"])
            mine = row is None or (p.row["ok"] and row[1] == p.row["response"])  # the same reply: its twin
            p.first = None if mine else _call_row(row)
        if p.row["ok"]:
            earlier.setdefault(p.row["request_hash"], []).append(p.row)


# The error of a failed call recorded after another process's success of the same request (its caller used
# that success): kept for the cost it had, and skipped by verify's as-of lookup.
SUPERSEDED = "superseded by an earlier success: "


def _superseded(error: str | None) -> bool:
    return error is not None and error.startswith(SUPERSEDED)


def _row_of(row: Any) -> CallRow:
    return CallRow(row[0], json.loads(row[1]) if row[1] else None, row[2], row[3], row[4])


def _call_row(row: Any) -> CallRow | None:
    return None if row is None else _row_of(row)


def _new_row(*, run_id: str, role: str, request_hash: str, model: str, request: dict[str, Any] | str,
             response: dict[str, Any] | str | None, prompt_tokens: int, completion_tokens: int, latency_ms: float,
             error: str | None) -> dict[str, Any]:
    """A call row as inserted (`created_at` is set when it is queued); its error with credentials masked."""
    return dict(run_id=run_id, role=role, request_hash=request_hash, model=model,
                request=request if isinstance(request, str) else canonical_json(request),
                response=canonical_json(response) if isinstance(response, dict) else response,
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, latency_ms=latency_ms,
                error=redact(error) if error is not None else None, ok=error is None)


class CallJournal:
    """The call journal's reads and writes (a mixin of `Store`)."""

    engine: Engine
    _write_lock: threading.Lock

    def _init_journal(self) -> None:
        self._calls_cond = threading.Condition()
        self._calls_pending: list[_PendingCall] = []
        self._calls_writing = False

    def find_call(self, request_hash: str, *, run_ids: list[str] | None = None,
                  as_of: dt.datetime | None = None) -> CallRow | None:
        """The response a request is served: the first successful call.

        With `as_of` (verify), the outcome an event appended at that time saw:
        the request's latest call recorded by then decides whether it had
        failed (that error) or succeeded (the first successful call, which is
        what was served)."""
        params: dict[str, Any] = {"request_hash": request_hash}
        scoped = run_ids is not None
        if scoped:
            params["run_ids"] = list(run_ids or ())
        if as_of is None:
            with self.engine.connect() as conn:
                return _call_row(conn.execute(_FIRST_OK[scoped], params).first())
        params["as_of"] = as_of
        with self.engine.connect() as conn:  # one query: a request has few rows
            rows = [r for r in conn.execute(_AS_OF[scoped], params).all() if not _superseded(r[2])]
        if not rows or rows[-1][2] is not None:
            return _call_row(rows[-1] if rows else None)
        return _call_row(next(r for r in rows if r[2] is None))

    def find_calls(self, request_hashes: list[str], *, run_ids: list[str] | None = None) -> dict[str, CallRow]:
        """`find_call` of many requests (without `as_of`) in one query per
        500: the first successful call of each request that has one."""
        with self.engine.connect() as conn:
            rows = _first_ok_rows(conn, request_hashes, run_ids)
        return {h: _row_of(row) for h, row in rows.items()}

    def record_call(self, *, run_id: str, role: str, request_hash: str, model: str, request: dict[str, Any] | str,
                    response: dict[str, Any] | str | None, prompt_tokens: int, completion_tokens: int,
                    latency_ms: float, error: str | None, check: bool = False,
                    scope: list[str] | None = None) -> CallRow | None:
        """Journal one call. `request` is the request, or its canonical JSON
        when the caller already has it (the text its hash was taken of);
        `response` the reply, or its canonical JSON.

        With `check`, the call is checked in its own commit against the
        journal (the runs in `scope`, or all runs): when an earlier successful
        call of the same request is there (another process recorded it since
        the caller last looked) with another reply, or this call failed, that
        call is returned. Its reply is the one to use: resume and verify
        serve it. A failed call superseded so is recorded as SUPERSEDED, which
        verify skips (an error after a success would tell it that the request
        had failed), so its cost still counts."""
        pending = _PendingCall(_new_row(run_id=run_id, role=role, request_hash=request_hash, model=model,
                                        request=request, response=response, prompt_tokens=prompt_tokens,
                                        completion_tokens=completion_tokens, latency_ms=latency_ms, error=error),
                               check, scope)
        self._commit([pending])
        return pending.first

    def record_calls(self, calls: list[dict[str, Any]], *, check: bool = False,
                     scope: list[str] | None = None) -> list[CallRow | None]:
        """Journal several calls in one commit (the same group commit as
        `record_call`'s), each given as `record_call`'s keyword arguments
        but `check` and `scope`, which hold for all: the rows of one batched
        request (embeddings). Returns, per call, what `record_call` returns."""
        pending = [_PendingCall(_new_row(**call), check, scope) for call in calls]
        self._commit(pending)
        return [p.first for p in pending]

    def _commit(self, mine: list[_PendingCall]) -> None:
        """Queue `mine` and return once all of them are committed: written by
        the batch this caller writes, or by another caller's batch."""
        with self._calls_cond:
            for pending in mine:
                pending.row["created_at"] = utc_now()  # in the order of the ids the rows get
                self._calls_pending.append(pending)
            while not all(p.done for p in mine):
                if not self._calls_writing:  # no batch in flight: write all that is queued, these rows too
                    self._calls_writing = True
                    batch, self._calls_pending = self._calls_pending, []
                    break
                self._calls_cond.wait()
            else:
                failed = next((p.error for p in mine if p.error is not None), None)
                if failed is not None:
                    raise failed
                return
        self._write_calls(batch, mine)  # (all of `mine`: a caller's rows are queued, and taken, together)

    def _write_calls(self, batch: list[_PendingCall], mine: list[_PendingCall]) -> None:
        """Group commit: the calls recorded while the previous batch was being
        written go in one transaction. Every caller returns only once its row
        is committed (a resumed run is served every call that returned); the
        callers of a batch that failed all raise its error."""
        error: Exception | None = None
        try:
            with self._write_lock, self.engine.begin() as conn:
                checked = [p for p in batch if p.check]
                if conn.dialect.name == "postgresql":
                    keys = sorted({_lock_key(p.row["request_hash"]) for p in batch if p.row["ok"] or p.check})
                    if keys:
                        conn.execute(_LOCK_KEYS, {"keys": keys})
                elif checked:
                    conn.execute(_SQLITE_WRITE_LOCK)
                _first_calls(conn, batch)
                for p in checked:  # (set anew: an interrupted batch's success may not be written before it now)
                    if not p.row["ok"]:
                        superseded = p.first is not None and not _superseded(p.failure)
                        p.row["error"] = SUPERSEDED + str(p.failure) if superseded else p.failure
                conn.execute(_INSERT_CALL, [p.row for p in batch])
        except Exception as err:
            error = err
        except BaseException:  # interrupted, nothing written: the other callers write their rows themselves
            with self._calls_cond:
                own = {id(p) for p in mine}
                self._calls_pending[:0] = [p for p in batch if id(p) not in own]
                self._calls_writing = False
                self._calls_cond.notify_all()
            raise
        with self._calls_cond:
            for p in batch:
                p.done, p.error = True, error
            self._calls_writing = False
            self._calls_cond.notify_all()
        if error is not None:
            raise error

    def request_of(self, request_hash: str) -> dict[str, Any] | None:
        """The request a hash stands for (its canonical JSON in the call table), or None."""
        query = select(llm_calls.c.request).where(llm_calls.c.request_hash == request_hash).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return json.loads(row[0]) if row is not None else None

    def read_calls(self, run_id: str) -> list[CallRecord]:
        """The calls a run sent, in the order they were recorded."""
        query = (select(llm_calls.c.id, llm_calls.c.role, llm_calls.c.request_hash, llm_calls.c.error,
                        llm_calls.c.created_at)
                 .where(llm_calls.c.run_id == run_id).order_by(llm_calls.c.id))
        with self.engine.connect() as conn:
            return [CallRecord(*r) for r in conn.execute(query)]

    def failed_sent(self, run_id: str) -> dict[str, int]:
        """The calls this run sent that failed: error text -> count."""
        query = (select(llm_calls.c.error, func.count()).where(llm_calls.c.run_id == run_id, llm_calls.c.ok.is_(False))
                 .group_by(llm_calls.c.error))
        with self.engine.connect() as conn:
            return {str(r[0]): int(r[1]) for r in conn.execute(query)}

    def paid_by_model(self, run_id: str) -> list[tuple[str, str, int, int, int]]:
        """(role, model, calls, prompt tokens, completion tokens) this run sent."""
        query = (
            select(llm_calls.c.role, llm_calls.c.model, func.count(), func.sum(llm_calls.c.prompt_tokens),
                   func.sum(llm_calls.c.completion_tokens))
            .where(llm_calls.c.run_id == run_id).group_by(llm_calls.c.role, llm_calls.c.model)
            .order_by(llm_calls.c.role, llm_calls.c.model)
        )
        with self.engine.connect() as conn:
            return [(r[0], r[1], int(r[2]), int(r[3] or 0), int(r[4] or 0)) for r in conn.execute(query)]
