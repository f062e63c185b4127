"""The store contract, run against every backend (SQLite, PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import ClassVar

import pytest
from pydantic import Field

from skillstate.errors import ConcurrencyError, UserError
from skillstate.log import event_codec as ev
from skillstate.log.event_codec import decode
from skillstate.log.events import Event, StepStarted
from skillstate.storage.migrate import HEAD_REVISION, current_revision, head_revision
from skillstate.storage.store import GENESIS, event_hash, open_store


def _step(n: int) -> StepStarted:
    return StepStarted(step=n, epoch=1, batch_item_ids=[f"i{n}"], edit_budget=4)


def test_schema_is_created_by_migrations(any_store):
    assert current_revision(any_store.engine) == head_revision() == HEAD_REVISION


def test_opening_a_database_at_the_head_revision_loads_no_migration_machinery(tmp_path):
    # the everyday open (`skillstate runs`, a resumed run) checks the schema without importing Alembic
    db = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(db).close()
    probe = ("import sys; from skillstate.storage.store import open_store; s = open_store(sys.argv[1], create=False); "
             "s.close(); print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))")
    out = subprocess.run([sys.executable, "-c", probe, db], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_append_and_read_back_with_hash_chain(any_store):
    stored = any_store.append("r1", [_step(1), _step(2)], last_seq=0, last_hash=GENESIS, new_run={})
    more = any_store.append("r1", [_step(3)], last_seq=2, last_hash=stored[-1].hash)
    got = any_store.read_events("r1")
    assert [s.seq for s in got] == [1, 2, 3]
    assert got[0].prev_hash == GENESIS
    assert got[2].prev_hash == got[1].hash == stored[1].hash
    assert got[2].hash == more[0].hash
    for s in got:
        assert event_hash(s.prev_hash, s.run_id, s.seq, s.type, s.version, s.payload) == s.hash
    assert got[1].event == _step(2)


def test_losing_append_raises_concurrency_error_and_writes_nothing(any_store):
    first = any_store.append("r1", [_step(1)], last_seq=0, last_hash=GENESIS, new_run={})
    any_store.append("r1", [_step(2)], last_seq=1, last_hash=first[0].hash)
    with pytest.raises(ConcurrencyError, match="another writer"):
        any_store.append("r1", [_step(2), _step(3)], last_seq=1, last_hash=first[0].hash,
                         blobs_to_put={"x" * 64: "orphan"})
    assert [s.seq for s in any_store.read_events("r1")] == [1, 2]
    assert any_store.find_blob("x" * 64) is None  # the losing transaction rolled back whole


def test_racing_writers_never_duplicate_a_sequence_number(any_store):
    base = any_store.append("r1", [_step(1)], last_seq=0, last_hash=GENESIS, new_run={})
    outcomes = []

    def writer():
        try:
            any_store.append("r1", [_step(2)], last_seq=1, last_hash=base[0].hash)
            outcomes.append("ok")
        except ConcurrencyError:
            outcomes.append("lost")

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost", "lost", "lost", "ok"]
    assert [s.seq for s in any_store.read_events("r1")] == [1, 2]


def test_creating_an_existing_run_is_a_user_error(any_store):
    any_store.append("r1", [_step(1)], last_seq=0, last_hash=GENESIS, new_run={})
    with pytest.raises(UserError, match="already exists"):
        any_store.append("r1", [_step(1)], last_seq=0, last_hash=GENESIS, new_run={})


def test_blobs_are_content_addressed_and_stored_once(any_store):
    h1 = any_store.put_blob("# Skill\nsame text\n")
    h2 = any_store.put_blob("# Skill\nsame text\n")
    assert h1 == h2
    assert any_store.get_blob(h1) == "# Skill\nsame text\n"
    from sqlalchemy import func, select

    from skillstate.storage.store import blobs

    with any_store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(blobs)).scalar() == 1
    assert any_store.get_blobs([h1, "0" * 64]) == {h1: "# Skill\nsame text\n"}


def test_llm_calls_are_found_by_request_hash_and_scope(any_store):
    kw = dict(role="target", model="m", request={"q": 1}, prompt_tokens=3, completion_tokens=2, latency_ms=1.0)
    any_store.record_call(run_id="a", request_hash="h1", response=None, error="Timeout", **kw)
    assert any_store.find_call("h1") is None  # errors are not served on resume
    failed_at = any_store.read_calls("a")[-1].created_at
    assert any_store.find_call("h1", as_of=failed_at).error == "Timeout"  # verify: what an event then saw
    any_store.record_call(run_id="a", request_hash="h1", response={"text": "hi"}, error=None, **kw)
    assert any_store.find_call("h1").response == {"text": "hi"}
    assert any_store.find_call("h1", as_of=failed_at).error == "Timeout"  # the later success does not leak back
    assert any_store.find_call("h1", as_of=any_store.read_calls("a")[-1].created_at).response == {"text": "hi"}
    assert any_store.find_call("h1", run_ids=["b"]) is None
    assert [row[:3] for row in any_store.paid_by_model("a")] == [("target", "m", 2)]


def test_runs_are_listed_and_latest_is_found(any_store):
    any_store.append("r1", [_step(1)], last_seq=0, last_hash=GENESIS, new_run={})
    any_store.append("r2", [_step(1)], last_seq=0, last_hash=GENESIS, new_run={"parent_run_id": "r1", "fork_step": 0})
    assert [r.run_id for r in any_store.list_runs()] == ["r1", "r2"]
    assert any_store.latest_run_id() == "r2"
    assert any_store.get_run("r2").parent_run_id == "r1"


class _Probe(Event):
    """A test-only event whose schema went from v1 (`name`) to v2 (`title`, `size`)."""

    type: ClassVar[str] = "TestProbe"
    version: ClassVar[int] = 2
    title: str
    size: int = Field(0)


def test_old_event_versions_are_upcast_on_read_and_rows_never_rewritten(any_store):
    ev.register(_Probe)
    ev.UPCASTERS[("TestProbe", 1)] = lambda p: {"title": p["name"], "size": 0}
    try:
        import datetime as dt

        from sqlalchemy import insert

        from skillstate.storage.store import events, runs

        now = dt.datetime.now(dt.timezone.utc)
        payload = '{"name":"old"}'
        with any_store.engine.begin() as conn:
            conn.execute(insert(runs).values(run_id="old", created_at=now))
            conn.execute(insert(events).values(
                run_id="old", seq=1, type="TestProbe", version=1, payload=payload, prev_hash=GENESIS,
                hash=event_hash(GENESIS, "old", 1, "TestProbe", 1, payload), created_at=now))
        stored = any_store.read_events("old")[0]
        assert stored.event == _Probe(title="old", size=0)
        assert stored.version == 1 and stored.payload == payload  # the row is as written
        with pytest.raises(ev.UnknownEventError):
            decode("TestProbe", 3, {})
    finally:
        ev.EVENT_TYPES.pop("TestProbe", None)
        ev.UPCASTERS.pop(("TestProbe", 1), None)
