"""Repair (`repair: ablate`) in real runs on the sim's noisy world: the run
completes with `EditsAblated` in its steps, the ablation rollouts are
journaled calls, replay --verify reproduces it, `show --step`, the
dashboard's step page and `why` say what was dropped and why, a fork turns
it on, and a kill -9 in the middle of a repair (or just before it) resumes
to the same events."""

from __future__ import annotations

import json
from html import unescape

import pytest
from run_helpers import OLD_LOOP, call, kill_at_pause, log_of, start_driver, stored_events
from starlette.testclient import TestClient

from skillstate.dashboard.app import create_app
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store

NOISY = ["--set", "sim.noise=moderate", *OLD_LOOP]
REPAIR = [*NOISY, "--set", "repair=ablate", "--set", "drop_rejected_edits=0",  # the paths these tests read
          "--set", "repair_clauses=false"]  # whole edits only (clauses: test_repair_clauses.py)
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def repaired(tmp_path_factory):
    """A noisy run of 2 epochs with repair on, and the same run without it."""
    path = tmp_path_factory.mktemp("repair")
    db = f"sqlite:///{path / 'r.db'}"
    call("run", "--run-id", "r", "--epochs", "2", "-q", *REPAIR, "--db", db)
    call("run", "--run-id", "plain", "--epochs", "2", "-q", *NOISY, "--set", "repair=off", "--db", db)
    return db


def test_a_noisy_run_with_repair_completes_with_the_events_and_verifies(repaired):
    db = repaired
    log = log_of(db, "r")
    assert log[-1]["type"] == "RunCompleted"
    ablated = [e["payload"] for e in log if e["type"] == "EditsAblated"]
    assert ablated and not [e for e in log_of(db, "plain") if e["type"] == "EditsAblated"]  # turned off
    done = [a for a in ablated if a["ablations"]]
    assert done, "no step was repaired"
    for a in done:
        assert a["affected_types"] and all(a["changes"][t] < -0.3 for t in a["affected_types"])  # repair_type_loss
        assert len(a["ablations"]) <= 3  # repair_max_edits
        for ab in a["ablations"]:  # rolled out on the affected items only, every rollout a journaled call
            assert [r["item_id"] for r in ab["results"]] == a["item_ids"]
            assert all(r["call"] for r in ab["results"])
    dropped = [a for a in done if a["dropped"]]
    assert dropped, "no edit was dropped"
    for a in dropped:
        assert len(a["dropped"]) == 1 and a["skill"]
        top = next(ab for ab in a["ablations"] if ab["index"] == a["dropped"][0])
        assert top["harmful"] and all(ab["recovered"] < top["recovered"] for ab in a["ablations"] if ab is not top)
        # the repaired candidate is the step's: built, evaluated and gated after the ablation
        step = [e for e in log if e["payload"].get("step") == a["step"]]
        kinds = [e["type"] for e in step]
        at = kinds.index("EditsAblated")
        assert kinds[at + 1:] == ["CandidateBuilt", "CandidateEvaluated", "GateDecided"]
        assert step[at + 1]["payload"]["skill"] == a["skill"] == step[at + 2]["payload"]["skill"]
        assert "repaired: dropped edit" in step[-1]["payload"]["reason"]
    assert "repair" in call("show", "r", "--json", "--db", db)  # booked as its own stage
    assert "reproduces all" in call("replay", "r", "--verify", "--db", db)
    assert "intact" in call("audit", "r", "--db", db)


def test_show_the_dashboard_and_why_say_what_was_dropped_and_why(repaired):
    db = repaired
    a = next(e["payload"] for e in log_of(db, "r") if e["type"] == "EditsAblated" and e["payload"]["dropped"])
    culprit = next(ab for ab in a["ablations"] if ab["index"] == a["dropped"][0])
    text = call("show", "r", "--step", str(a["step"]), "--db", db)
    assert "repair: dropped edit" in text and "recovered" in text and "repaired candidate on val" in text
    detail = json.loads(call("show", "r", "--step", str(a["step"]), "--json", "--db", db))
    assert detail["repair"]["dropped"] == a["dropped"] and detail["repair"]["affected_types"] == a["affected_types"]
    store = Store(db)
    try:
        with TestClient(create_app(store, allowed_hosts=["testserver"])) as client:
            html = unescape(client.get(f"/runs/r/steps/{a['step']}").text)
        assert 'id="repair"' in html and "dropped: did harm" in html and culprit["edit"]["content"] in html
    finally:
        store.close()
    why = call("why", "--db", db, "--", "r", culprit["edit"]["content"])
    assert f"step {a['step']}: dropped by the repair" in why
    assert ", ".join(a["affected_types"]) in why
    info = json.loads(call("why", "--json", "--db", db, "--", "r", culprit["edit"]["content"]))
    assert info["found"] and info["dropped"][0]["recovered"] == culprit["recovered"]


def test_a_fork_turns_repair_on_and_verifies(repaired):
    db = repaired
    call("fork", "plain", "step_2", "--set", "repair=ablate", "--run-id", "plain-repair", "-q", "--db", db)
    log = log_of(db, "plain-repair")
    assert log[0]["payload"]["overrides"] == {"repair": "ablate"}
    assert any(e["type"] == "EditsAblated" for e in log)
    assert "reproduces all" in call("replay", "plain-repair", "--verify", "--db", db)


# --- kill -9 in the middle of a repair, then resume ----------------------------


def test_kill9_in_the_middle_of_a_repair_then_resume_gives_the_samestored_events(tmp_path):
    args = ["--epochs", "2", "-q", *REPAIR]
    clean_db = f"sqlite:///{tmp_path / 'clean.db'}"
    call("run", "--run-id", "k", *args, "--db", clean_db)
    clean = stored_events(clean_db, "k")
    first = next(i for i, (t, p) in enumerate(clean) if t == "EditsAblated" and json.loads(p)["ablations"])
    db = f"sqlite:///{tmp_path / 'k.db'}"
    # 1. killed right after the candidate's evaluation: the repair is the next stage
    p = start_driver(tmp_path, "run", ["run", "--run-id", "k", *args, "--db", db], SWEEP_PAUSE_EVENTS=str(first))
    assert kill_at_pause(tmp_path, "run", p) == f"events {first}"
    assert stored_events(db, "k") == clean[:first]
    # 2. the resume is killed in the middle of the repair: some ablation calls recorded, no event yet
    p = start_driver(tmp_path, "mid", ["resume", "k", "-q", "--db", db], SWEEP_PAUSE_CALLS="3")
    assert kill_at_pause(tmp_path, "mid", p) == "calls 3"
    assert stored_events(db, "k") == clean[:first]
    # 3. the last resume finishes: the same events as the uninterrupted run, no call paid twice
    p = start_driver(tmp_path, "last", ["resume", "k", "-q", "--db", db])
    assert p.wait(timeout=TIMEOUT) == 0, (tmp_path / "last.err").read_text()[-2000:]
    assert stored_events(db, "k") == clean
    store = Store(db)
    try:
        assert audit(store, "k").ok
        report = verify(store, "k")
        assert report.ok and report.checked == len(clean), report.divergence
        ok = [c.request_hash for c in store.read_calls("k") if c.error is None]
        assert len(ok) == len(set(ok))
    finally:
        store.close()
