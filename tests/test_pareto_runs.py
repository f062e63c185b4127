"""Parent selection (`parent_selection: pareto`) and the screen of edits
rejected before (`drop_rejected_edits`) in real runs on the sim's noisy
world: the events, the gate comparing with the drawn parent, replay
--verify, `show --step`, `why`, a fork that turns them on, and kill -9
right after a step started on a drawn parent."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from run_helpers import OLD_LOOP, call, kill_at_pause, log_of, start_driver, stored_events

from skillstate.cli.main import cli
from skillstate.log.events import Edit
from skillstate.reading.audit import audit, verify
from skillstate.skillopt.screen import edit_key
from skillstate.storage.store import Store

NOISY = ["--set", "sim.noise=moderate", *OLD_LOOP]
PARETO = [*NOISY, "--set", "parent_selection=pareto"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A noisy run of 2 epochs drawing parents, one screening rejected edits, and a plain one."""
    path = tmp_path_factory.mktemp("pareto")
    db = f"sqlite:///{path / 'p.db'}"
    call("run", "--run-id", "p", "--epochs", "2", "-q", *PARETO, "--db", db)
    call("run", "--run-id", "d", "--epochs", "2", "-q", *NOISY, "--set", "drop_rejected_edits=1", "--db", db)
    call("run", "--run-id", "plain", "--epochs", "2", "-q", *NOISY, "--db", db)
    return db


def test_each_step_after_the_first_accept_draws_its_parent_and_the_gate_compares_with_it(runs):
    db = runs
    log = log_of(db, "p")
    assert log[-1]["type"] == "RunCompleted"
    assert not [e for e in log_of(db, "plain") if e["type"] == "ParentChosen"]  # off by default
    kinds = [e["type"] for e in log]
    chosen = [e["payload"] for e in log if e["type"] == "ParentChosen"]
    assert chosen, "no parent was drawn"
    for i, kind in enumerate(kinds):
        if kind == "ParentChosen":
            assert kinds[i - 1] == "StepStarted" and kinds[i + 1] == "RolloutCompleted"
    for c in chosen:
        members = {m["skill"]: m for m in c["front"]}
        assert c["skill"] in members and c["score"] == members[c["skill"]]["score"] and c["pool"] >= 2
        step = [e for e in log if e["payload"].get("step") == c["step"]]
        rollout = next(e["payload"] for e in step if e["type"] == "RolloutCompleted")
        gate = next(e["payload"] for e in step if e["type"] == "GateDecided")
        built = next(e["payload"] for e in step if e["type"] == "CandidateBuilt")
        assert rollout["skill"] == built["base_skill"] == c["skill"]  # the step builds on the parent
        assert gate["current_score"] == c["score"]  # and the gate compares with it
    assert any(c["skill"] != c["previous_skill"] for c in chosen), "the draw never left the current skill"
    assert "reproduces all" in call("replay", "p", "--verify", "--db", db)
    assert "intact" in call("audit", "p", "--db", db)


def test_show_and_why_say_which_parent_a_step_built_on(runs):
    db = runs
    c = next(e["payload"] for e in log_of(db, "p") if e["type"] == "ParentChosen"
             and e["payload"]["skill"] != e["payload"]["previous_skill"])
    text = call("show", "p", "--step", str(c["step"]), "--db", db)
    assert "parent:" in text and "switched" in text and "front" in text
    detail = json.loads(call("show", "p", "--step", str(c["step"]), "--json", "--db", db))
    assert detail["parent"]["skill"] == c["skill"] and detail["parent"]["switched"]
    store = Store(db)
    try:
        before, after = store.get_blob(c["previous_skill"]), store.get_blob(c["skill"])
    finally:
        store.close()
    lines = [ln for ln in before.splitlines() if ln.startswith("- ") and ln not in after]
    lines += [ln for ln in after.splitlines() if ln.startswith("- ") and ln not in before]
    assert lines, "the parent and the previous skill hold the same rules"
    info = json.loads(call("why", "--json", "--db", db, "--", "p", lines[0][2:]))
    assert any(ch["by"] == "parent" and ch["step"] == c["step"] for ch in info["changes"])
    assert "built on another accepted skill" in call("why", "--db", db, "--", "p", lines[0][2:])


def test_a_screened_run_drops_edits_rejected_before_and_counts_them_right(runs):
    db = runs
    log = log_of(db, "d")
    counts: dict = {}
    screened = 0
    selected: list = []
    for e in log:
        p = e["payload"]
        if e["type"] == "PatchesMerged":
            merged = [Edit.model_validate(x) for x in p["edits"]]
        elif e["type"] == "EditsSelected":
            selected = [Edit.model_validate(x) for x in p["edits"]]
            reasons = {d["index"]: d["reason"] for d in p["dropped"]}
            for i, edit in enumerate(merged):
                if reasons.get(i) == "rejected_before":
                    screened += 1
                    assert counts.get(edit_key(edit), 0) >= 1
            for edit in selected:
                assert counts.get(edit_key(edit), 0) == 0  # never selected again after a rejection
        elif e["type"] == "EditsAblated":
            for a in p["ablations"]:
                if a["harmful"] and (a["index"] in p["dropped"] or a["index"] in p["trimmed"]):  # as proposed
                    k = edit_key(Edit.model_validate(a["edit"]))
                    counts[k] = counts.get(k, 0) + 1
        elif e["type"] == "GateDecided" and p["decision"] == "reject":
            for edit in {edit_key(x) for x in selected}:
                counts[edit] = counts.get(edit, 0) + 1
    assert screened, "no edit was screened out"
    step = next(e["payload"]["step"] for e in log if e["type"] == "EditsSelected"
                and any(d["reason"] == "rejected_before" for d in e["payload"]["dropped"]))
    assert "dropped (rejected before)" in call("show", "d", "--step", str(step), "--db", db)
    assert "reproduces all" in call("replay", "d", "--verify", "--db", db)


def test_a_fork_turns_both_on_and_verifies(runs):
    db = runs
    call("fork", "plain", "step_3", "--set", "parent_selection=pareto", "--set", "drop_rejected_edits=1",
         "--run-id", "plain-p", "-q", "--db", db)
    log = log_of(db, "plain-p")
    assert log[0]["payload"]["overrides"] == {"parent_selection": "pareto", "drop_rejected_edits": 1}
    assert any(e["type"] == "ParentChosen" for e in log)
    assert "reproduces all" in call("replay", "plain-p", "--verify", "--db", db)


def test_parent_selection_is_refused_in_bank_mode():
    res = CliRunner().invoke(cli, ["run", "--set", "mode=bank", "--set", "parent_selection=pareto", "--db",
                                   "sqlite:///:memory:"])
    assert res.exit_code == 2 and "parent_selection" in res.output and "Traceback" not in res.output


# --- kill -9 right after a step started on a drawn parent, then resume ----------


def test_kill9_after_a_drawn_parent_then_resume_gives_the_samestored_events(tmp_path):
    args = ["--epochs", "1", "-q", *PARETO]
    clean_db = f"sqlite:///{tmp_path / 'clean.db'}"
    call("run", "--run-id", "k", *args, "--db", clean_db)
    clean = stored_events(clean_db, "k")
    first = next(i for i, (t, _) in enumerate(clean) if t == "ParentChosen") + 1  # pause after it
    db = f"sqlite:///{tmp_path / 'k.db'}"
    p = start_driver(tmp_path, "run", ["run", "--run-id", "k", *args, "--db", db], SWEEP_PAUSE_EVENTS=str(first))
    assert kill_at_pause(tmp_path, "run", p) == f"events {first}"
    assert stored_events(db, "k") == clean[:first]
    call("resume", "k", "-q", "--db", db)
    assert stored_events(db, "k") == clean
    store = Store(db)
    try:
        assert audit(store, "k").ok and verify(store, "k").ok
    finally:
        store.close()
