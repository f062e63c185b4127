"""The robust gate in real runs on the sim world (gate_rule paired,
gate_type_margin): runs complete, replay, verify exactly and fork with the
rule changed; early reject keeps the decisions; the verdicts are in the log,
in `show --step` and in `why`; old logs read as they were written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import small_config
from run_helpers import OLD_LOOP

from skillstate.cli.main import cli
from skillstate.engine.runner import lineage_events
from skillstate.log.event_codec import decode
from skillstate.log.events import GateDecided
from skillstate.reading.audit import audit, verify
from skillstate.trainer import Trainer


def call(*args: str, code: int = 0) -> str:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == code, res.output
    return res.output


def gates(db: str, run_id: str) -> list[dict]:
    return [e["payload"] for e in json.loads(call("log", run_id, "--json", "--db", db)) if e["type"] == "GateDecided"]


@pytest.mark.slow  # a run, its verify and a fork: about 9 s
def test_a_paired_run_completes_replays_verifies_and_forks_with_the_rule_changed(tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    call("run", "--run-id", "base", "--epochs", "2", "-q", *OLD_LOOP, "--db", db)
    call("run", "--run-id", "p", "--epochs", "2", "-q", *OLD_LOOP, "--set", "gate_rule=paired", "--set",
         "gate_type_margin=0.1", "--db", db)
    strict = gates(db, "base")
    assert strict and all(g["rule"] == "strict" and g["paired"] is None and g["type_guard"] is None for g in strict)
    paired = [g for g in gates(db, "p") if g["decision"] != "skip"]
    assert paired and all(g["rule"] == "paired" and g["paired"] and g["type_guard"] for g in paired)
    for g in paired:  # the decision follows from the recorded verdicts
        p, guard = g["paired"], g["type_guard"]
        accepted = g["decision"] in ("accept", "accept_best")
        assert accepted == (g["candidate_score"] > g["current_score"] and p["passed"] and guard["passed"])
        assert guard["passed"] == all(loss <= 0.1 for loss in guard["losses"].values())
        assert f"paired {p['wins']} won, {p['losses']} lost, {p['ties']} tied" in g["reason"]
        if accepted:
            assert p["wins"] > p["losses"] and not p["bound"]
    assert any(g["decision"] == "reject" for g in paired) and any(g["decision"] == "accept_best" for g in paired)
    # early rejects under the paired rule: the bound's verdicts, recomputed from the recorded prefix
    assert any(g["paired"]["bound"] and "rejected early" in g["reason"] for g in paired)

    for run_id in ("base", "p"):
        assert "reproduces all" in call("replay", run_id, "--verify", "--db", db)
        assert "intact" in call("audit", run_id, "--db", db)
    replayed = json.loads(call("replay", "p", "--to-step", "2", "--json", "--db", db))
    assert replayed["current_score"] is not None

    # fork the strict run at step 2 with the paired rule, and the paired one back to the strict rule
    assert "forked base-paired from base at step 2" in call("fork", "base", "step_2", "--set", "gate_rule=paired",
                                                            "--run-id", "base-paired", "-q", "--db", db)
    call("fork", "p", "step_2", "--set", "gate_rule=strict", "--set", "gate_type_margin=null", "--run-id",
         "p-strict", "-q", "--db", db)
    forked = json.loads(call("log", "base-paired", "--json", "--db", db))
    assert forked[0]["type"] == "RunForked" and forked[0]["payload"]["overrides"] == {"gate_rule": "paired"}
    assert all(g["rule"] == "paired" and g["paired"] for g in gates(db, "base-paired") if g["decision"] != "skip")
    assert all(g["rule"] == "strict" and g["paired"] is None for g in gates(db, "p-strict"))
    for run_id in ("base-paired", "p-strict"):
        assert "reproduces all" in call("replay", run_id, "--verify", "--db", db)

    # shown where the decision is: show --step and why
    step = next(i + 1 for i, g in enumerate(gates(db, "p")) if g["decision"] == "accept_best")
    text = call("show", "p", "--step", str(step), "--db", db)
    assert "paired test:" in text and "type guard (margin 0.1" in text and ": pass" in text
    detail = json.loads(call("show", "p", "--step", str(step), "--json", "--db", db))
    assert detail["decision"]["rule"] == "paired" and detail["decision"]["paired"]["passed"] is True
    added = [ln[1:] for ln in call("diff", "p", "0", str(step), "--db", db).splitlines()
             if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip()]
    assert added
    why = call("why", "--db", db, "--", "p", added[0])
    assert f"step {step} " in why and "paired" in why
    info = json.loads(call("why", "--json", "--db", db, "--", "p", added[0]))
    assert info["changes"][-1]["paired"]["passed"] is True


def test_early_reject_gives_the_same_decisions_under_the_paired_rule(tmp_path):
    # with the step buffer off, the prompts do not see the early reject's bound: the runs must match
    def run(on: bool):
        # repair off: the candidates it may examine are scored in full (test_early_reject covers that case)
        cfg = small_config(early_reject=on, use_step_buffer=False, gate_rule="paired", gate_type_margin=0.0,
                           gate_metric="mixed", repair="off")
        return Trainer(cfg, db=f"sqlite:///{tmp_path / f'{on}.db'}", run_id="r").train()

    on, off = run(True), run(False)
    events = {k: [s.event for s in lineage_events(r.store, "r")] for k, r in (("on", on), ("off", off))}
    decided = {k: [(e.step, e.decision) for e in evs if e.type == "GateDecided"] for k, evs in events.items()}
    assert decided["on"] == decided["off"]
    partial = [e for e in events["on"] if e.type == "CandidateEvaluated" and e.partial]
    assert partial, "no candidate was rejected early"
    assert on.summary["usage"]["target"]["calls"] < off.summary["usage"]["target"]["calls"]
    for key in ("best_score", "best_step", "test"):
        assert on.summary[key] == off.summary[key]
    report = verify(on.store, "r")
    assert report.ok and report.checked == report.total


def test_after_a_slow_update_the_paired_gate_pairs_with_its_recorded_outcomes(tmp_path):
    # a forced slow update becomes the current skill; its per-item outcomes come from SlowUpdateDecided
    for gated in (False, True):
        cfg = small_config(num_epochs=3, use_slow_update=True, slow_update_gate=gated, gate_rule="paired")
        result = Trainer(cfg, db=f"sqlite:///{tmp_path / f'su-{gated}.db'}", run_id="r").train()
        events = [s.event for s in lineage_events(result.store, "r")]
        slow = [e for e in events if e.type == "SlowUpdateDecided"]
        assert slow
        if gated:
            assert all("paired" in e.reason for e in slow if e.decision != "skip")
        else:
            assert any(e.forced and e.decision == "accept" for e in slow)
            boundary = events.index(slow[0])
            after = [e for e in events[boundary:] if e.type == "GateDecided" and e.decision != "skip"]
            assert after and all(e.paired is not None for e in after)
        assert audit(result.store, "r").ok
        report = verify(result.store, "r")
        assert report.ok and report.checked == report.total


def test_a_decision_logged_before_the_robust_rules_reads_as_the_strict_rules():
    old = {"step": 3, "decision": "reject", "candidate_score": 0.5, "current_score": 0.6, "best_score": 0.6,
           "reason": "0.5000 <= current 0.6000", "forced": False}
    ev = decode("GateDecided", 1, old)
    assert isinstance(ev, GateDecided) and ev.rule == "strict" and ev.paired is None and ev.type_guard is None
    assert GateDecided.version == 2


def test_bad_robust_gate_settings_are_refused_in_one_line(tmp_path):
    db = f"sqlite:///{tmp_path / 'bad.db'}"
    for setting, word in (("gate_rule=bootstrap", "gate_rule"), ("gate_confidence=0.3", "gate_confidence"),
                          ("gate_confidence=1", "gate_confidence"), ("gate_type_margin=-0.1", "gate_type_margin")):
        res = CliRunner().invoke(cli, ["run", "--epochs", "1", "-q", "--set", setting, "--db", db])
        assert res.exit_code == 2 and word in res.output and "Traceback" not in res.output
    assert not (tmp_path / "bad.db").exists() or json.loads(call("runs", "--json", "--db", db)) == []  # no run left
