"""audit finds the first bad event; verify finds the first divergence."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import small_config
from sqlalchemy import delete, select, update

from skillstate.cli.main import cli
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store, blobs, events, llm_calls
from skillstate.trainer import Trainer


def _run_and_fork(url):
    store = Store(url)
    try:
        Trainer(small_config(num_epochs=1), store=store, run_id="r").train()
        Trainer(store=store, run_id="r").fork(1, {"edit_budget": 3}, "f").train()
    finally:
        store.close()


@pytest.fixture
def run_db(tmp_path, run_templates):
    """A finished run `r` and its finished fork `f` (a copy of one built once per worker: each test damages its
    own)."""
    url = run_templates.copy("audit_run_and_fork", _run_and_fork, tmp_path / "a.db")
    store = Store(url)
    yield store, url
    store.close()


def _seq_of(store, run_id, type_name, nth=0):
    return [s.seq for s in store.read_events(run_id) if s.type == type_name][nth]


def _cli_audit(url, run_id):
    return CliRunner().invoke(cli, ["audit", run_id, "--db", url])


def test_intact_logs_pass(run_db):
    store, url = run_db
    assert audit(store, "r").ok and audit(store, "f").ok
    assert _cli_audit(url, "f").exit_code == 0


def test_an_altered_payload_is_named(run_db):
    store, url = run_db
    seq = _seq_of(store, "r", "GateDecided")
    with store.engine.begin() as conn:
        payload = conn.execute(select(events.c.payload).where(events.c.run_id == "r", events.c.seq == seq)).scalar()
        forged = json.loads(payload)
        forged["reason"] = "forged"
        conn.execute(update(events).where(events.c.run_id == "r", events.c.seq == seq)
                     .values(payload=json.dumps(forged, sort_keys=True, separators=(",", ":"))))
    report = audit(store, "r")
    assert report.problems == [f"run r event {seq} (GateDecided): hash mismatch (the stored event was altered)"]
    res = _cli_audit(url, "r")
    assert res.exit_code == 1 and f"event {seq} (GateDecided)" in res.output
    # the fork inherits that prefix: its audit fails too
    assert "fork parent" in audit(store, "f").problems[0]


def test_a_missing_event_breaks_the_sequence(run_db):
    store, _ = run_db
    with store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.run_id == "r", events.c.seq == 5))
    assert "event 6: sequence is not contiguous" in audit(store, "r").problems[0]


def test_a_missing_or_corrupted_blob_is_found(run_db):
    store, _ = run_db
    first = store.read_events("r")[0].event
    with store.engine.begin() as conn:
        conn.execute(delete(blobs).where(blobs.c.hash == first.initial_skill))
    assert "run r event 1 (RunStarted): blob" in audit(store, "r").problems[0]
    assert "is missing" in audit(store, "r").problems[0]


def test_an_unknown_event_type_is_found(run_db):
    store, _ = run_db
    from skillstate.storage.store import event_hash

    last = store.read_events("r")[-1]
    payload = "{}"
    with store.engine.begin() as conn:
        conn.execute(events.insert().values(
            run_id="r", seq=last.seq + 1, type="Mystery", version=1, payload=payload, prev_hash=last.hash,
            hash=event_hash(last.hash, "r", last.seq + 1, "Mystery", 1, payload), created_at=last.created_at))
    assert "(Mystery): cannot be read: unknown event type 'Mystery'" in audit(store, "r").problems[0]


def test_verify_names_the_first_divergence(run_db):
    store, url = run_db
    assert verify(store, "f").ok
    # make the recorded reply of the first ranking call say something else
    seq = _seq_of(store, "r", "EditsSelected")
    sel = [s.event for s in store.read_events("r") if s.seq == seq][0]
    calls = [s.event.call for s in store.read_events("r") if s.type == "PatchProposed" and s.event.call]
    target = calls[0].request_hash
    with store.engine.begin() as conn:
        conn.execute(update(llm_calls).where(llm_calls.c.request_hash == target)
                     .values(response=json.dumps({"text": "garbage now"})))
    report = verify(store, "r")
    assert not report.ok
    first_patch = _seq_of(store, "r", "PatchProposed")
    assert report.seq == first_patch and report.divergence.startswith("PatchProposed:")
    res = CliRunner().invoke(cli, ["replay", "r", "--verify", "--db", url])
    assert res.exit_code == 1 and f"diverges at event {first_patch}" in res.output
    assert audit(store, "r").ok  # the event log itself is intact; only the call table was changed
    assert sel.step == 1


def test_reading_commands_on_a_corrupt_log_fail_in_one_line(run_db):
    store, url = run_db
    from skillstate.storage.store import event_hash

    last = store.read_events("r")[-1]
    with store.engine.begin() as conn:
        conn.execute(events.insert().values(
            run_id="r", seq=last.seq + 1, type="Mystery", version=1, payload="{}", prev_hash=last.hash,
            hash=event_hash(last.hash, "r", last.seq + 1, "Mystery", 1, "{}"), created_at=last.created_at))
    for cmd in (["replay", "r", "--to-step", "1"], ["show", "r"], ["export", "r"]):
        res = CliRunner().invoke(cli, [*cmd, "--db", url])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        assert "unknown event type 'Mystery'" in res.output and len(res.output.splitlines()) == 1
    # `runs` lists every run, this one as damaged, and then fails in one line naming the damage
    res = CliRunner().invoke(cli, ["runs", "--db", url])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    *table, last = res.output.splitlines()
    assert table[2].split()[:2] == ["r", "damaged"] and "unknown event type 'Mystery'" in last


def test_a_damaged_blob_of_the_parent_is_named_by_the_forks_audit_and_resume(run_db):
    """The fork inherits the parent's prefix and its blobs: a trajectory named only in the parent's
    baseline results, cut, is named (its run, event and blob) by both runs' audits and by resume."""
    from skillstate.storage.blob_walk import trajectories_in

    store, url = run_db
    own = store.read_events("r")
    direct = {h for s in own for h in s.event.blob_refs()}
    (base,) = [s for s in own if s.type == "BaselineEvaluated"]
    h = next(t for t in trajectories_in(store.get_blob(base.event.results)) if t not in direct)
    with store.engine.begin() as conn:
        data = conn.execute(select(blobs.c.data).where(blobs.c.hash == h)).scalar_one()
        conn.execute(update(blobs).where(blobs.c.hash == h).values(data=bytes(data)[:-4]))
    where = f"run r event {base.seq} (BaselineEvaluated): blob {h[:12]} (named in blob {base.event.results[:12]})"
    assert audit(store, "r").problems[0].startswith(where)
    assert audit(store, "f").problems[0].startswith(f"fork parent: {where}")
    before = store.read_events("f")[-1].hash
    res = CliRunner().invoke(cli, ["resume", "f", "-q", "--db", url])
    assert res.exit_code == 1 and where in res.output and len(res.output.splitlines()) == 1, res.output
    assert store.read_events("f")[-1].hash == before
