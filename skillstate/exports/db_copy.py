"""Copying runs between databases (`skillstate db copy`): from a laptop's
SQLite to a team's PostgreSQL, and back.

A run is copied with everything it needs to be audited, verified, resumed
and forked at the destination without paying for a request again:

- its fork ancestors, first (a fork's log starts from its parent's prefix);
- its events byte for byte: payload, hashes, signatures and timestamps
  (verify serves each event the calls recorded before its timestamp);
- every blob its events name, and the blobs those name in turn (a results
  blob names the trajectories of its items);
- its rows in the call table, and every row of a request its log or its
  blobs mention, whichever run sent it: under `llm_cache: all` a run is
  served calls that other runs paid for.

"Name" and "mention" are read off the stored text: every 64-digit hex
string in an event's payload or a referenced blob that is a blob or a
journaled request at the source (`skillstate.storage.blob_walk`, the walker `audit`
and `resume` check blobs with). That is a superset of `Event.blob_refs` and
of the call references `failures.event_call_refs` finds, whatever the event
version. A damaged blob is copied as it is stored (audit then names it).

Each run is written in one transaction at the destination, under its lease
there, in batches. A run already there with the same log is left as it is
("already there"); one whose log there is a strict prefix of the source's
(the source run grew) gets only the missing events; one with a different log
is refused before anything at all is written. The source is only read: a run
being driven there is copied up to its last committed event (its events are
read with one SELECT, a consistent snapshot).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError

from skillstate.errors import NotFoundError, UserError
from skillstate.storage.blob_walk import IN_CHUNK, chunks, hashes_in, walk_blobs
from skillstate.storage.lease import RunLease
from skillstate.storage.schema import blobs, events, llm_calls, run_leases, runs
from skillstate.storage.store import RunRow, Store, StoredEvent, insert_ignoring_duplicates

EVENT_BATCH = 2000  # rows per INSERT batch
CALL_BATCH = 500  # call rows hold whole requests and responses
BLOB_BATCH = 500

_CALL_COLUMNS = [c for c in llm_calls.c if c.name != "id"]
_CALLS_BY_HASH = (select(llm_calls.c.id, *_CALL_COLUMNS)
                  .where(llm_calls.c.request_hash.in_(bindparam("hashes", expanding=True))))
_CALLS_OF_RUN = select(llm_calls.c.id, *_CALL_COLUMNS).where(llm_calls.c.run_id == bindparam("run_id"))
_CALL_KEYS_BY_HASH = (select(llm_calls.c.run_id, llm_calls.c.role, llm_calls.c.request_hash, llm_calls.c.created_at)
                      .where(llm_calls.c.request_hash.in_(bindparam("hashes", expanding=True))))
_BLOB_HASHES = select(blobs.c.hash).where(blobs.c.hash.in_(bindparam("hashes", expanding=True)))
_REQUEST_HASHES = select(llm_calls.c.request_hash).distinct().where(
    llm_calls.c.request_hash.in_(bindparam("hashes", expanding=True)))


@dataclass
class RunCopy:
    """What copying one run did."""

    run_id: str
    status: str  # copied | appended | already there
    events: int  # in the source's snapshot
    events_copied: int = 0
    blobs_copied: int = 0
    calls_copied: int = 0
    parent_run_id: str | None = None
    ancestor: bool = False  # not asked for: copied because a fork named needs it
    driven: bool = False  # a driver held its lease at the source: copied up to its last committed event
    audit_ok: bool | None = None
    audit_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class CopyReport:
    source: str
    destination: str
    runs: list[RunCopy] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.audit_ok is not False for r in self.runs)

    def totals(self) -> dict[str, int]:
        return {k: sum(getattr(r, k) for r in self.runs)
                for k in ("events", "events_copied", "blobs_copied", "calls_copied")}

    def to_json(self) -> dict[str, Any]:
        totals = self.totals()
        rate = totals["events_copied"] / self.seconds if self.seconds > 0 else None
        return {"source": self.source, "destination": self.destination, "ok": self.ok,
                "seconds": round(self.seconds, 3), "events_copied_per_second": round(rate, 1) if rate else None,
                **totals, "runs": [{**asdict(r), "seconds": round(r.seconds, 3)} for r in self.runs]}


# --- helpers ---------------------------------------------------------------------------------------------------


def _utc(value: dt.datetime) -> dt.datetime:
    """A stored timestamp as an aware UTC datetime (SQLite hands back naive UTC)."""
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def _event_key(s: StoredEvent) -> tuple[Any, ...]:
    created = _utc(s.created_at) if s.created_at is not None else None
    return (s.seq, s.type, s.version, s.payload, s.prev_hash, s.hash, s.mac, created)


def same_database(a: str, b: str) -> bool:
    """Whether two URLs name one database (a SQLite file by its real path)."""
    try:
        ua, ub = make_url(a), make_url(b)
    except ArgumentError:  # not a URL: opening it says so
        return False
    if ua.get_backend_name() == ub.get_backend_name() == "sqlite":
        return os.path.realpath(ua.database or "") == os.path.realpath(ub.database or "")
    return ua.render_as_string(hide_password=False) == ub.render_as_string(hide_password=False)


def runs_to_copy(source: Store, run_ids: list[str] | None) -> list[tuple[RunRow, bool]]:
    """The runs named (default: all), each after its fork ancestors, with
    whether it was only added as an ancestor. An unknown id is a NotFoundError."""
    rows = {r.run_id: r for r in source.list_runs()}
    if run_ids is None:
        wanted = list(rows)
    else:
        missing = [r for r in run_ids if r not in rows]
        if missing:
            raise NotFoundError(f"unknown run {missing[0]!r} in {source.display_url} (see `skillstate runs "
                                f"--db {source.display_url}`); nothing was copied")
        wanted = list(dict.fromkeys(run_ids))
    asked = set(wanted)
    order: list[tuple[RunRow, bool]] = []
    placed: set[str] = set()

    def place(run_id: str, trail: tuple[str, ...]) -> None:
        if run_id in placed:
            return
        row = rows.get(run_id)
        if row is None:
            raise UserError(f"run {trail[-1]!r} in {source.display_url} is a fork of run {run_id!r}, which is not "
                            "there; nothing was copied")
        if run_id in trail:
            raise UserError(f"run {run_id!r} in {source.display_url} is its own fork ancestor; nothing was copied")
        if row.parent_run_id is not None:
            place(row.parent_run_id, (*trail, run_id))
        placed.add(run_id)
        order.append((row, run_id not in asked))

    for run_id in wanted:
        place(run_id, ())
    return order


def _what(row: RunRow) -> str:
    kind = "an evaluation run" if row.kind == "eval" else f"a {row.kind} run"
    return kind if row.parent_run_id is None else f"{kind} forked from {row.parent_run_id!r} at step {row.fork_step}"


def _difference(run_id: str, src_row: RunRow, src: list[StoredEvent], dst_row: RunRow,
                dst: list[StoredEvent], where: str) -> str | None:
    """Why the destination's run cannot take the source's log (None: it is a prefix of it, or equal)."""
    if (dst_row.parent_run_id, dst_row.fork_step, dst_row.kind) != (src_row.parent_run_id, src_row.fork_step,
                                                                    src_row.kind):
        return (f"run {run_id!r} exists in {where} with a different log (there {_what(dst_row)}, here "
                f"{_what(src_row)})")
    if len(dst) > len(src):
        return f"run {run_id!r} exists in {where} with a different log ({len(dst)} events there, {len(src)} here)"
    for a, b in zip(src, dst, strict=False):
        if _event_key(a) != _event_key(b):
            return f"run {run_id!r} exists in {where} with a different log (event {b.seq} differs)"
    return None


def _lease_held(source: Store, run_id: str) -> bool:
    with source.engine.connect() as conn:
        row = conn.execute(select(run_leases.c.expires_at).where(run_leases.c.run_id == run_id)).first()
    return row is not None and _utc(row[0]) > dt.datetime.now(dt.timezone.utc)


# --- reading what a run needs at the source --------------------------------------------------------------------


@dataclass
class _Needs:
    blob_rows: dict[str, tuple[int, bytes]]  # hash -> (size, compressed data), as stored at the source
    call_rows: list[dict[str, Any]]  # in the source's order (id)


def _needs(source: Store, run_id: str, stored: list[StoredEvent]) -> _Needs:
    """The blobs the run's events name (transitively) and the call rows it needs."""
    with source.engine.connect() as conn:
        walk = walk_blobs(conn, hashes_in(s.payload for s in stored))
        seen_blobs, mentioned = walk.rows, walk.mentioned
        requests = sorted(mentioned - set(seen_blobs))
        rows: dict[int, dict[str, Any]] = {}
        for r in conn.execute(_CALLS_OF_RUN, {"run_id": run_id}):
            rows[r.id] = dict(r._mapping)
        for chunk in chunks(requests, IN_CHUNK):
            for r in conn.execute(_CALLS_BY_HASH, {"hashes": chunk}):
                rows.setdefault(r.id, dict(r._mapping))
    calls = [rows[i] for i in sorted(rows)]
    for row in calls:
        del row["id"]
        row["created_at"] = _utc(row["created_at"])
    return _Needs(seen_blobs, calls)


# --- writing at the destination --------------------------------------------------------------------------------


def _write_blobs(conn: Connection, items: dict[str, tuple[int, bytes]]) -> int:
    hashes = sorted(items)
    existing: set[str] = set()
    for chunk in chunks(hashes, IN_CHUNK):
        existing.update(r[0] for r in conn.execute(_BLOB_HASHES, {"hashes": chunk}))
    # in hash order, like Store._put_blobs: two writers of the same blobs never deadlock
    rows = [dict(hash=h, size=items[h][0], data=items[h][1]) for h in hashes if h not in existing]
    for chunk in chunks(rows, BLOB_BATCH):
        conn.execute(insert_ignoring_duplicates(conn, blobs), chunk)
    return len(rows)


def _call_key(run_id: str, role: str, request_hash: str, created_at: dt.datetime) -> tuple[str, str, str, str]:
    return (run_id, role, request_hash, _utc(created_at).isoformat())


def _write_calls(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """The call rows the destination lacks (a row is its run, role, request and time), in the source's order."""
    hashes = sorted({r["request_hash"] for r in rows})
    have: set[tuple[str, str, str, str]] = set()
    for chunk in chunks(hashes, IN_CHUNK):
        have.update(_call_key(*r) for r in conn.execute(_CALL_KEYS_BY_HASH, {"hashes": chunk}))
    new = [r for r in rows if _call_key(r["run_id"], r["role"], r["request_hash"], r["created_at"]) not in have]
    for chunk in chunks(new, CALL_BATCH):
        conn.execute(insert(llm_calls), chunk)
    return len(new)


def _write_events(conn: Connection, stored: list[StoredEvent]) -> None:
    rows = [dict(run_id=s.run_id, seq=s.seq, type=s.type, version=s.version, payload=s.payload,
                 prev_hash=s.prev_hash, hash=s.hash, mac=s.mac,
                 created_at=_utc(s.created_at) if s.created_at is not None else None) for s in stored]
    for chunk in chunks(rows, EVENT_BATCH):
        conn.execute(insert(events), chunk)


def copy_run(source: Store, dest: Store, row: RunRow, *, ancestor: bool = False) -> RunCopy:
    """Copy one run (its ancestors must be at the destination already), in one transaction there."""
    started = time.perf_counter()
    driven = _lease_held(source, row.run_id)
    stored = source.read_events(row.run_id)  # one statement: a snapshot up to the last committed event
    needs = _needs(source, row.run_id, stored)
    result = RunCopy(row.run_id, "copied", len(stored), parent_run_id=row.parent_run_id, ancestor=ancestor,
                     driven=driven)
    with RunLease(dest, row.run_id):  # nobody drives it at the destination while it is written
        with dest._write_lock, dest.engine.begin() as conn:
            there = conn.execute(select(runs).where(runs.c.run_id == row.run_id)).first()
            have: list[StoredEvent] = []
            if there is not None:
                have = [StoredEvent(*r) for r in conn.execute(
                    select(events.c.run_id, events.c.seq, events.c.type, events.c.version, events.c.payload,
                           events.c.prev_hash, events.c.hash, events.c.created_at, events.c.mac)
                    .where(events.c.run_id == row.run_id).order_by(events.c.seq))]
                problem = _difference(row.run_id, row, stored, RunRow(**there._mapping), have, dest.display_url)
                if problem:
                    raise UserError(f"{problem}; nothing was copied for it")
            else:
                conn.execute(insert(runs).values(run_id=row.run_id, parent_run_id=row.parent_run_id,
                                                 fork_step=row.fork_step, kind=row.kind,
                                                 created_at=_utc(row.created_at)))
            missing = stored[len(have):]
            # blobs and calls first: an event is never there without what it names
            result.blobs_copied = _write_blobs(conn, needs.blob_rows)
            result.calls_copied = _write_calls(conn, needs.call_rows)
            _write_events(conn, missing)
            result.events_copied = len(missing)
    if there is not None:
        result.status = "appended" if missing else "already there"
    result.seconds = time.perf_counter() - started
    return result


def check_conflicts(source: Store, dest: Store, order: list[tuple[RunRow, bool]]) -> None:
    """Refuse (UserError, one line) before anything is written when a run exists at the
    destination with a log that is not a prefix of the source's."""
    there = {r.run_id: r for r in dest.list_runs()}
    for row, _ in order:
        dst_row = there.get(row.run_id)
        if dst_row is None:
            continue
        problem = _difference(row.run_id, row, source.read_events(row.run_id), dst_row,
                              dest.read_events(row.run_id), dest.display_url)
        if problem:
            raise UserError(f"{problem}; nothing was copied")


def copy_runs(source: Store, dest: Store, run_ids: list[str] | None = None, *, audit_after: bool = True,
              on_run: Callable[[RunCopy], None] | None = None) -> CopyReport:
    """Copy runs (default: all) with their fork ancestors, blobs and calls
    from `source` to `dest`, then audit each at `dest`."""
    from skillstate.reading.audit import audit

    if same_database(source.url, dest.url):
        raise UserError(f"--from and --to name the same database ({source.display_url}); nothing to copy")
    started = time.perf_counter()
    report = CopyReport(source.display_url, dest.display_url)
    order = runs_to_copy(source, run_ids)
    check_conflicts(source, dest, order)
    for row, ancestor in order:
        result = copy_run(source, dest, row, ancestor=ancestor)
        if audit_after:
            checked = audit(dest, row.run_id)
            result.audit_ok, result.audit_problems = checked.ok, list(checked.problems)
        report.runs.append(result)
        if on_run is not None:
            on_run(result)
    report.seconds = time.perf_counter() - started
    return report
