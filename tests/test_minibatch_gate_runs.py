"""GEPA's loop from skillstate's knobs, in real runs on the sim's noisy world: small batches, parents
drawn from the per-val-item front (`parent_selection: items`), the candidate checked on its step's batch
before any validation call (`minibatch_gate`), and a budget of calls (`max_calls`). The events, the
gate's reasons, replay --verify, audit, a fork that turns the gate on, and bad input."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from run_helpers import OLD_LOOP, call, log_of

from skillstate.cli.main import cli
from skillstate.log.event_codec import decode

SMALL = ["--set", "sim.noise=moderate", *OLD_LOOP, "--set", "repair=off", "--set", "batch_size=3",
         "--set", "minibatch_size=3"]
GEPA = [*SMALL, "--set", "parent_selection=items", "--set", "minibatch_gate=true", "--set", "use_gate=false",
        "--set", "max_calls=500"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run with GEPA's loop, one with small batches and the usual gate (to fork)."""
    db = f"sqlite:///{tmp_path_factory.mktemp('gepa') / 'g.db'}"
    call("run", "--run-id", "g", "--epochs", "1", "-q", *GEPA, "--db", db)
    call("run", "--run-id", "s", "--epochs", "1", "-q", *SMALL, "--set", "max_calls=300", "--db", db)
    return db


def steps_of(log: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in log:
        step = e["payload"].get("step")
        if isinstance(step, int) and e["type"] not in ("RunCompleted", "StopConditionMet"):
            out.setdefault(step, []).append(e)
    return out


def test_a_checked_candidate_reaches_validation_only_when_it_beats_its_parent_on_the_batch(runs):
    log = log_of(runs, "g")
    assert log[-1]["type"] == "RunCompleted"
    passed = failed = 0
    for step, events in steps_of(log).items():
        kinds = [e["type"] for e in events]
        gate = next(e["payload"] for e in events if e["type"] == "GateDecided")
        if "CandidateChecked" not in kinds:  # a step with nothing to try is skipped before any candidate
            assert gate["decision"] == "skip", step
            continue
        check = next(e["payload"] for e in events if e["type"] == "CandidateChecked")
        rollout = next(e["payload"] for e in events if e["type"] == "RolloutCompleted")
        assert kinds.index("CandidateChecked") > kinds.index("CandidateBuilt")
        assert check["passed"] == (check["candidate_total"] > check["parent_total"])
        assert check["parent_total"] == pytest.approx(sum(r["hard"] for r in rollout["results"]))
        if check["results"]:
            assert check["item_ids"] == [r["item_id"] for r in rollout["results"]]
            assert check["candidate_total"] == pytest.approx(sum(r["hard"] for r in check["results"]))
        if check["passed"]:
            passed += 1
            assert "CandidateEvaluated" in kinds and gate["decision"] in ("accept", "accept_best")
            assert "passed the minibatch gate" in gate["reason"]
        else:
            failed += 1
            assert "CandidateEvaluated" not in kinds and gate["decision"] == "reject"
            assert gate["candidate_score"] is None and gate["reason"].startswith("minibatch gate:")
    assert passed and failed, (passed, failed)
    step = next(s for s, events in steps_of(log).items() if any(e["type"] == "CandidateChecked" for e in events))
    assert "minibatch gate: candidate" in call("show", "g", "--step", str(step), "--db", runs)
    assert "reproduces all" in call("replay", "g", "--verify", "--db", runs)
    assert "intact" in call("audit", "g", "--db", runs)


def test_parents_come_from_the_per_item_front_of_the_skills_accepted(runs):
    log = log_of(runs, "g")
    chosen = [e["payload"] for e in log if e["type"] == "ParentChosen"]
    assert chosen, "no parent was drawn"
    train = {i for e in log if e["type"] == "RolloutCompleted" for i in (r["item_id"] for r in e["payload"]["results"])}
    for c in chosen:
        members = {m["skill"]: m for m in c["front"]}
        assert c["skill"] in members and c["reason"].endswith(f"{len(members[c['skill']]['types'])} val items")
        led = {i for m in c["front"] for i in m["types"]}
        assert led and not led & train  # val items, never train ones
    assert any(c["skill"] != c["previous_skill"] for c in chosen)


def test_no_step_starts_once_the_calls_reach_max_calls(runs):
    for run, limit in (("g", 500), ("s", 300)):
        log = log_of(runs, run)
        calls = 0
        last_start = None
        for e in log:
            if e["type"] == "StepStarted":
                assert calls < limit, (run, e["payload"]["step"], calls)
                last_start = e["payload"]["step"]
            if e["type"] == "TestEvaluated":
                break
            calls += sum(u.calls for u in decode(e["type"], e["version"], e["payload"]).usage().values())
        assert calls >= limit and last_start is not None and last_start < 40  # stopped before the epoch's 40 steps
        assert any(e["type"] == "TestEvaluated" for e in log) and log[-1]["type"] == "RunCompleted"
        shown = " ".join(call("show", run, "--db", runs).split())
        assert f"the steps ended once the run's calls reached {limit}, after {last_start} of 40 steps" in shown


def test_a_fork_turns_the_minibatch_gate_on_and_verifies(runs):
    call("fork", "s", "step_3", "--set", "minibatch_gate=true", "--set", "max_calls=400", "--run-id", "s-g", "-q",
         "--db", runs)
    log = log_of(runs, "s-g")
    assert log[0]["payload"]["overrides"] == {"minibatch_gate": True, "max_calls": 400}
    assert any(e["type"] == "CandidateChecked" for e in log)
    assert "reproduces all" in call("replay", "s-g", "--verify", "--db", runs)


@pytest.mark.parametrize("args, word", [
    (["--set", "max_calls=0"], "max_calls"),
    (["--set", "mode=bank", "--set", "minibatch_gate=true"], "minibatch_gate"),
    (["--set", "parent_selection=front"], "parent_selection"),
])
def test_bad_settings_are_one_line_errors(args, word):
    res = CliRunner().invoke(cli, ["run", *args, "--db", "sqlite:///:memory:"])
    assert res.exit_code == 2 and word in res.output and "Traceback" not in res.output
