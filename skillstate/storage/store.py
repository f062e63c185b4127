"""The SQL event store: runs, events and blobs, and (`skillstate.storage.call_journal`) the LLM calls.

SQLAlchemy 2 Core over the tables in `skillstate.storage.schema` (created and
upgraded only by the Alembic migrations in `skillstate.migrations`). SQLite is used with a busy
timeout, in WAL mode once a writer opened it (reading never changes a file); PostgreSQL works
through any SQLAlchemy URL, with a connect timeout.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import Table, bindparam, create_engine, event, func, insert, select
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError

from skillstate.errors import ConcurrencyError, CorruptLogError, NotFoundError, UserError
from skillstate.log.event_codec import decode, encode_json
from skillstate.log.events import Event
from skillstate.storage.call_journal import CallJournal, utc_now
from skillstate.storage.migrate import raise_if_damaged, require_database_file
from skillstate.storage.schema import blobs, events, llm_calls, metadata, run_leases, runs  # noqa: F401  (re-exported)
from skillstate.util import DEFAULT_DB, canonical_json, check_run_id, first_line, sha256_text

GENESIS = "0" * 64


def event_hash(prev_hash: str, run_id: str, seq: int, type_name: str, version: int, payload_json: str) -> str:
    return sha256_text(canonical_json([prev_hash, run_id, seq, type_name, version]) + payload_json)


@dataclass(frozen=True)
class StoredEvent:
    run_id: str
    seq: int
    type: str
    version: int
    payload: str  # canonical JSON exactly as stored
    prev_hash: str
    hash: str
    created_at: dt.datetime | None
    mac: str | None = None

    # Decoded once: the chain check, the fold and the readers all ask for it (an
    # event is immutable, and so is the stored row it is decoded from).
    @cached_property
    def event(self) -> Event:
        return decode(self.type, self.version, json.loads(self.payload))

    @cached_property
    def step(self) -> int | None:
        """The step the event belongs to, if any (read without decoding the event)."""
        return json.loads(self.payload).get("step")


@dataclass(frozen=True)
class RunRow:
    run_id: str
    parent_run_id: str | None
    fork_step: int | None
    kind: str
    created_at: dt.datetime


# The statements of the hot paths, built once: building a SQLAlchemy statement
# and its cache key costs more than SQLite takes to run it. Values are bound
# at execution, so the SQL sent is the same as a statement built per call.
_INSERT_EVENTS = insert(events)
_BLOBS_IN = select(blobs.c.hash, blobs.c.data).where(blobs.c.hash.in_(bindparam("hashes", expanding=True)))
_BLOB_HASHES_IN = select(blobs.c.hash).where(blobs.c.hash.in_(bindparam("hashes", expanding=True)))
_EVENTS_OF_RUN = (select(events.c.run_id, events.c.seq, events.c.type, events.c.version, events.c.payload,
                         events.c.prev_hash, events.c.hash, events.c.created_at, events.c.mac)
                  .where(events.c.run_id == bindparam("run_id"), events.c.seq > bindparam("after"))
                  .order_by(events.c.seq))
_RUN_BY_ID = select(runs).where(runs.c.run_id == bindparam("run_id"))

# Blob texts this process wrote or read, by hash (content-addressed, so never
# stale), up to this many characters: the engine reads back what the stage
# before wrote (trajectories, skills) without a query. `get_blobs`, which
# audit uses, always reads the database.
BLOB_CACHE_CHARS = 16 * 2**20


def insert_ignoring_duplicates(conn: Connection, table: Table) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING on SQLite and PostgreSQL."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    return insert(table)


def _compress(text: str) -> bytes:
    return zlib.compress(text.encode("utf-8"), 6)


class BlobDamaged(CorruptLogError):
    """A stored blob no longer reads back as the text its hash names: cut,
    bit-flipped or rewritten. `blob_hash` is its key, `reason` what is wrong."""

    def __init__(self, blob_hash: str, reason: str):
        super().__init__(f"blob {blob_hash[:12]} {reason}")
        self.blob_hash, self.reason = blob_hash, reason


def read_blob(blob_hash: str, data: bytes) -> str:
    """The text of a stored blob, checked: BlobDamaged if its data does not
    decompress (truncated, bit-flipped) or its text does not hash to its key (altered)."""
    try:
        text = zlib.decompress(data).decode("utf-8")
    except (zlib.error, UnicodeDecodeError) as err:
        raise BlobDamaged(blob_hash, f"is damaged: it cannot be decompressed ({first_line(err)})") from None
    if sha256_text(text) != blob_hash:
        raise BlobDamaged(blob_hash, "does not match its hash (its content was altered)")
    return text


def make_engine(url: str, *, create: bool = True) -> Engine:
    """An engine for `url`. Without `create`, a SQLite file that does not exist is refused, not created."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(f"not a database URL: {url!r} (example: sqlite:///skillstate.db)") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise UserError("an in-memory SQLite database is not supported (the engine reads it from several "
                            "threads); use a file, e.g. sqlite:///skillstate.db")
        if not create:
            require_database_file(url)
        engine = create_engine(parsed, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")  # (these three change the connection, never the file)
            cur.close()

        @event.listens_for(engine, "handle_error")
        def _damaged(ctx):  # a corrupt file is the user's to fix (exit 2), wherever it shows
            raise_if_damaged(engine, ctx.original_exception)

        return engine
    try:
        # READ COMMITTED whatever the server's default: the call journal's check relies on it (call_journal)
        return create_engine(parsed, pool_pre_ping=True, isolation_level="READ COMMITTED",
                             connect_args=_connect_timeout(parsed))
    except Exception as err:  # missing driver, bad options
        raise UserError(f"cannot use database {parsed.render_as_string(hide_password=True)}: {err}") from None


# A PostgreSQL server that accepts the connection and never answers is given up on after this many
# seconds: the URL's own `?connect_timeout=N` first, then $SKILLSTATE_DB_CONNECT_TIMEOUT, then 10.
CONNECT_TIMEOUT_ENV = "SKILLSTATE_DB_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT = 10


def _connect_timeout(parsed: Any) -> dict[str, Any]:
    """The connect arguments that bound a libpq connection attempt (psycopg, psycopg2)."""
    if parsed.get_backend_name() != "postgresql" or parsed.get_driver_name() not in ("psycopg", "psycopg2"):
        return {}
    if "connect_timeout" in parsed.query:
        return {}
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    if not raw:
        return {"connect_timeout": DEFAULT_CONNECT_TIMEOUT}
    try:
        seconds = int(raw)
    except ValueError:
        seconds = 0
    if not 1 <= seconds <= 3600:
        raise UserError(f"${CONNECT_TIMEOUT_ENV} must be a whole number of seconds from 1 to 3600, got {raw[:40]!r}")
    return {"connect_timeout": seconds}


AUDIT_KEY_ENV = "SKILLSTATE_AUDIT_KEY"


def event_mac(key: str, event_hash_hex: str) -> str:
    """The keyed signature of an event: HMAC-SHA256 of its chain hash."""
    return hmac.new(key.encode("utf-8"), event_hash_hex.encode("ascii"), hashlib.sha256).hexdigest()


def audit_key() -> str | None:
    return os.environ.get(AUDIT_KEY_ENV) or None


class Store(CallJournal):
    """All reads and writes of one database; the LLM call journal is `CallJournal`'s."""

    def __init__(self, url: str = DEFAULT_DB, *, upgrade: bool = True):
        self.url = url
        self.engine = make_engine(url)
        self._write_lock = threading.Lock()
        self._init_journal()
        self._blob_cache: OrderedDict[str, str] = OrderedDict()
        self._blob_cache_chars = 0
        self._blob_cache_lock = threading.Lock()
        self.audit_key = audit_key()
        if upgrade:
            from skillstate.storage.migrate import ensure_schema, ensure_wal

            ensure_schema(self.engine)
            ensure_wal(self.engine)

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    # -- runs -------------------------------------------------------------

    def create_run(self, run_id: str, *, parent_run_id: str | None = None, fork_step: int | None = None,
                   kind: str = "train") -> None:
        check_run_id(run_id)
        with self._write_lock, self.engine.begin() as conn:
            exists = conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).first()
            if exists:
                raise UserError(f"run {run_id!r} already exists")
            conn.execute(insert(runs).values(run_id=run_id, parent_run_id=parent_run_id, fork_step=fork_step,
                                             kind=kind, created_at=utc_now()))

    def get_run(self, run_id: str) -> RunRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(_RUN_BY_ID, {"run_id": run_id}).first()
        return RunRow(**row._mapping) if row else None

    def require_run(self, run_id: str | None) -> RunRow:
        """The run `run_id`, or without one the most recent training run
        (evaluation runs are only read when named)."""
        if run_id is None:
            run_id = self.latest_run_id()
            if run_id is None:
                if self.latest_run_id(kind=None) is not None:
                    raise NotFoundError(f"no training runs in {self.display_url}, only evaluation runs; name one "
                                        "(see `skillstate runs`) or start a training run with `skillstate run`")
                raise NotFoundError(f"no runs in {self.display_url}; start one with `skillstate run`")
        row = self.get_run(run_id)
        if row is None:
            raise NotFoundError(f"unknown run {run_id!r} in {self.display_url} (see `skillstate runs`)")
        return row

    def list_runs(self) -> list[RunRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(runs).order_by(runs.c.created_at, runs.c.run_id)).all()
        return [RunRow(**r._mapping) for r in rows]

    def latest_run_id(self, kind: str | None = "train") -> str | None:
        """The most recent run of `kind` ("train" or "eval"; None: any)."""
        query = select(runs.c.run_id)
        if kind is not None:
            query = query.where(runs.c.kind == kind)
        with self.engine.connect() as conn:
            row = conn.execute(query.order_by(runs.c.created_at.desc(), runs.c.run_id.desc()).limit(1)).first()
        return row[0] if row else None

    # -- events -----------------------------------------------------------

    def read_events(self, run_id: str, after: int = 0) -> list[StoredEvent]:
        """The run's events, or those after sequence number `after`."""
        with self.engine.connect() as conn:
            rows = conn.execute(_EVENTS_OF_RUN, {"run_id": run_id, "after": after}).all()
        return [StoredEvent(*r) for r in rows]

    def append(self, run_id: str, new_events: Iterable[Event], *, last_seq: int, last_hash: str,
               blobs_to_put: dict[str, str] | None = None,
               new_run: dict[str, Any] | None = None) -> list[StoredEvent]:
        """Append events after `last_seq`, with their blobs, in one transaction.

        With `new_run` (parent_run_id, fork_step, kind), the run row is
        created in the same transaction, so a run never exists without its
        first event. Raises ConcurrencyError if another writer appended to the
        run since the caller read `last_seq`.
        """
        if new_run is not None:
            check_run_id(run_id)
        stored: list[StoredEvent] = []
        prev, seq = last_hash, last_seq
        now = utc_now()
        for ev in new_events:
            seq += 1
            payload = encode_json(ev)
            h = event_hash(prev, run_id, seq, ev.type, ev.version, payload)
            mac = event_mac(self.audit_key, h) if self.audit_key else None
            stored.append(StoredEvent(run_id, seq, ev.type, ev.version, payload, prev, h, now, mac))
            prev = h
        if not stored:
            return stored
        with self._write_lock:
            try:
                with self.engine.begin() as conn:
                    if new_run is not None:
                        conn.execute(insert(runs).values(run_id=run_id, created_at=now, **new_run))
                    if blobs_to_put:
                        self._put_blobs(conn, blobs_to_put)
                    conn.execute(_INSERT_EVENTS, [
                        dict(run_id=s.run_id, seq=s.seq, type=s.type, version=s.version, payload=s.payload,
                             prev_hash=s.prev_hash, hash=s.hash, created_at=s.created_at, mac=s.mac)
                        for s in stored
                    ])
            except IntegrityError:
                # Only a real conflict is reported as one; anything else is the database's own error.
                if new_run is not None and self.get_run(run_id) is not None:
                    raise UserError(f"run {run_id!r} already exists") from None
                if new_run is None and self.last_seq(run_id) > last_seq:
                    raise ConcurrencyError(
                        f"run {run_id!r}: event {last_seq + 1} was appended by another writer; "
                        "reload the run and try again"
                    ) from None
                raise
        if blobs_to_put:
            self._remember_blobs(blobs_to_put)  # committed: now they are the database's
        return stored

    def last_seq(self, run_id: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.max(events.c.seq)).where(events.c.run_id == run_id)).scalar() or 0)

    # -- blobs ------------------------------------------------------------

    def _put_blobs(self, conn: Connection, items: dict[str, str]) -> None:
        """Insert the blobs that are not there yet. A blob is content-addressed,
        so another run inserting the same one at the same moment is no conflict."""
        hashes = list(items)
        existing: set[str] = set()
        for i in range(0, len(hashes), 500):
            chunk = hashes[i : i + 500]
            existing.update(r[0] for r in conn.execute(_BLOB_HASHES_IN, {"hashes": chunk}))
        # in hash order: two writers of the same new blobs then wait on each other in one order, never deadlock
        rows = [dict(hash=h, size=len(t), data=_compress(t)) for h, t in sorted(items.items()) if h not in existing]
        if rows:
            conn.execute(insert_ignoring_duplicates(conn, blobs), rows)

    def put_blobs(self, items: dict[str, str]) -> None:
        if not items:
            return
        with self._write_lock, self.engine.begin() as conn:
            self._put_blobs(conn, items)
        self._remember_blobs(items)

    def put_blob(self, text: str) -> str:
        h = sha256_text(text)
        self.put_blobs({h: text})
        return h

    def _remember_blobs(self, items: dict[str, str]) -> None:
        with self._blob_cache_lock:
            cache = self._blob_cache
            for h, text in items.items():
                if len(text) > BLOB_CACHE_CHARS // 4:
                    continue
                if h in cache:
                    cache.move_to_end(h)
                    continue
                cache[h] = text
                self._blob_cache_chars += len(text)
            while self._blob_cache_chars > BLOB_CACHE_CHARS:
                _, old = cache.popitem(last=False)
                self._blob_cache_chars -= len(old)

    def get_blob(self, blob_hash: str) -> str:
        with self._blob_cache_lock:
            text = self._blob_cache.get(blob_hash)
        if text is not None:
            return text
        text = self.find_blob(blob_hash)
        if text is None:  # events name it: the log is damaged, not the request
            raise BlobDamaged(blob_hash, "is missing from the database")
        self._remember_blobs({blob_hash: text})
        return text

    def get_blobs(self, hashes: list[str]) -> dict[str, str]:
        """The texts of the blobs that exist among `hashes` (always read from the database),
        each checked against its hash: a damaged one raises BlobDamaged."""
        out: dict[str, str] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(hashes), 500):
                chunk = hashes[i : i + 500]
                for h, data in conn.execute(_BLOBS_IN, {"hashes": chunk}):
                    out[h] = read_blob(h, data)
        return out

    def find_blob(self, blob_hash: str) -> str | None:
        return self.get_blobs([blob_hash]).get(blob_hash)


def open_store(url: str | None = None, *, create: bool = True, write: bool | None = None) -> Store:
    """Open the database at `url` (default $SKILLSTATE_DB, then sqlite:///skillstate.db), upgrading an
    older skillstate schema. With `create` a missing or empty database gets the schema; without it
    (reading, continuing a run) it is refused and nothing is created. With `write` (default: `create`)
    a read-only database, or a SQLite file whose pages are corrupted, is refused, and a SQLite file is
    put in WAL mode; reading changes nothing. Someone else's database, a damaged schema or a file that
    is not a database is refused either way (a UserError naming it), and left untouched."""
    from skillstate.storage.migrate import (
        DatabaseProblem,
        check_file_intact,
        check_writable,
        db_reason,
        ensure_schema,
        ensure_wal,
    )

    store = Store(url or os.environ.get("SKILLSTATE_DB") or DEFAULT_DB, upgrade=False)  # no connection yet
    try:
        if not create:
            require_database_file(store.url)
        ensure_schema(store.engine, create=create)
        if create if write is None else write:
            check_writable(store.engine)
            check_file_intact(store.engine)  # nothing is written into a corrupted file
            ensure_wal(store.engine)
    except BaseException as err:
        store.close()
        if isinstance(err, SQLAlchemyError):
            raise DatabaseProblem(f"cannot open database {store.display_url}: {db_reason(err)}") from None
        raise
    return store
