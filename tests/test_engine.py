"""The engine on the sim backend: learning, resume, determinism, fallbacks."""

from __future__ import annotations

import json

import pytest
from conftest import Crash, assert_paid_once, crashing_factory, logical_usage, scripted_factory, small_config

from skillstate.engine.runner import lineage_events
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer


def _payloads(store, run_id):
    return [(s.type, s.payload) for s in lineage_events(store, run_id)]


def test_default_run_learns_and_the_gate_rejects_some_candidates(tmp_path):
    result = Trainer(db=f"sqlite:///{tmp_path / 'd.db'}").train()  # every default
    s = result.summary
    assert s["status"] == "completed" and s["steps"] == 12
    assert s["best_score"] >= s["baseline_score"] + 0.3
    assert s["test"]["best"]["hard"] >= s["test"]["baseline"]["hard"] + 0.3
    assert s["rejects"] >= 1 and s["accepts"] >= 1
    assert set(s["test"]["best"]["by_task_type"]) == {
        "arithmetic", "unit_conversion", "date_reasoning", "reading", "letter_counting", "list_ordering"}


def test_same_seed_same_log_whatever_the_concurrency(tmp_path, finished_run):
    a = Trainer(small_config(concurrency=1), db=f"sqlite:///{tmp_path / 'a.db'}", run_id="r").train()
    store, b, _ = finished_run  # small_config() at the default concurrency, 8 (the payloads do not hold the run id)
    assert b.state.config["concurrency"] == 8
    drop = lambda rows: [(t, p) for t, p in rows if t != "RunStarted"]  # noqa: E731  (config differs)
    assert drop(_payloads(a.store, "r")) == drop(_payloads(store, b.run_id))


@pytest.fixture
def clean(finished_run):
    """The uninterrupted run the crash tests compare with (they only read it): the session's `finished_run`, the
    same config (the payloads do not hold the run id)."""
    store, result, _ = finished_run
    return store, result


@pytest.mark.parametrize("after_calls", [30, 95, 640])  # baseline, reflect/merge of step 1, mid run
def test_resume_after_a_crash_mid_stage_reproduces_the_uninterrupted_run(tmp_path, after_calls, clean):
    store = Store(f"sqlite:///{tmp_path / 'crash.db'}")
    with pytest.raises(Crash):
        Trainer(small_config(), store=store, run_id="r", backend_factory=crashing_factory(after_calls)).train()
    assert audit(store, "r").ok  # nothing half-written
    resumed = Trainer(store=store, run_id="r").train()
    clean_store, clean_result = clean
    assert _payloads(store, "r") == _payloads(clean_store, clean_result.run_id)
    # every request was paid for once: what the crashed session sent is served on resume
    assert logical_usage(resumed.summary) == logical_usage(clean_result.summary)
    assert_paid_once(store, "r")


def test_resume_after_a_crash_between_events(tmp_path, clean):
    store = Store(f"sqlite:///{tmp_path / 'crash.db'}")

    def die_after_rollout(p):
        if p.kind == "event" and p.event.type == "RolloutCompleted" and p.event.step == 2:
            raise Crash()

    with pytest.raises(Crash):
        Trainer(small_config(), store=store, run_id="r", on_progress=die_after_rollout).train()
    Trainer(store=store, run_id="r").train()
    clean_store, clean_result = clean
    assert _payloads(store, "r") == _payloads(clean_store, clean_result.run_id)


def test_finished_run_is_verified_and_audited(finished_run):
    store, result, _ = finished_run
    assert audit(store, result.run_id).ok
    report = verify(store, result.run_id)
    assert report.ok and report.checked == report.total


def test_unparseable_analyst_replies_are_recorded_and_the_step_skips(tmp_path):
    result = Trainer(small_config(num_epochs=1), db=f"sqlite:///{tmp_path / 'u.db'}", run_id="r",
                     backend_factory=scripted_factory(optimizer=lambda prompt: "Sure! I'd add a rule.")).train()
    events = [s.event for s in lineage_events(result.store, "r")]
    patches = [e for e in events if e.type == "PatchProposed"]
    assert patches and all(p.status == "unparseable" and p.reply for p in patches)
    assert result.store.get_blob(patches[0].reply) == "Sure! I'd add a rule."
    assert [e.decision for e in events if e.type == "GateDecided"] == ["skip"] * 3
    assert result.state.best_skill == result.state.initial_skill


def _analyst_then(merge_reply: str, rank_reply: str):
    def optimizer(prompt: str) -> str:
        if "<failures>" in prompt or "<successes>" in prompt:
            src = "F" if "<failures>" in prompt else "S"
            n = prompt.count('"id"')
            return json.dumps({"reasoning": "r", "failure_summary": [], "edits": [
                {"op": "append", "target": "", "content": f"- rule {src}{n} a"},
                {"op": "append", "target": "", "content": f"- rule {src}{n} b"}]})
        if "<edits>" in prompt:
            return rank_reply
        return merge_reply

    return optimizer


def test_merge_and_rank_failures_fall_back(tmp_path):
    # drop_rejected_edits 0: the screen would leave fewer edits than the budget after a rejection
    cfg = small_config(num_epochs=1, minibatch_size=4, merge_batch_size=2, drop_rejected_edits=0)
    result = Trainer(cfg, run_id="r", db=f"sqlite:///{tmp_path / 'f.db'}",
                     backend_factory=scripted_factory(optimizer=_analyst_then("not json", "no idea"))).train()
    events = [s.event for s in lineage_events(result.store, "r")]
    merged = [e for e in events if e.type == "PatchesMerged"]
    assert merged and all(m.status == "fallback" for e in merged for m in e.merges)
    assert any(m.level >= 2 for e in merged for m in e.merges)  # a real tree, level by level
    for e in merged:  # fallback keeps every proposed edit, failure edits first
        assert len(e.edits) == len(e.failure_edits) + len(e.success_edits)
        assert e.edits[: len(e.failure_edits)] == e.failure_edits
    for sel in (e for e in events if e.type == "EditsSelected"):
        assert sel.method == "fallback" and len(sel.edits) == sel.budget
        assert sel.edits[0].source == "failure"


def test_ranked_selection_keeps_the_rankers_choice(tmp_path):
    rank = json.dumps({"selected_indices": [3, 3, 99, 1, 0, 2]})
    result = Trainer(small_config(num_epochs=1, edit_budget=2, min_edit_budget=2), run_id="r",
                     db=f"sqlite:///{tmp_path / 'k.db'}",
                     backend_factory=scripted_factory(optimizer=_analyst_then("no", rank))).train()
    sel = [s.event for s in lineage_events(result.store, "r") if s.type == "EditsSelected"][0]
    kept = [i for i in range(sel.candidates) if i not in {d.index for d in sel.dropped}]  # what the ranker saw
    assert sel.method == "ranked" and sel.selected_indices == [kept[3], kept[1]]


def test_rollout_errors_become_failed_results_and_never_abort_the_step(tmp_path):
    def flaky_target(messages):
        if "letter" in messages[-1]["content"]:
            raise ValueError("upstream exploded")
        return "42"

    result = Trainer(small_config(num_epochs=1), db=f"sqlite:///{tmp_path / 'e.db'}", run_id="r",
                     backend_factory=scripted_factory(target=flaky_target)).train()
    rollouts = [s.event for s in lineage_events(result.store, "r") if s.type == "RolloutCompleted"]
    errors = [r for e in rollouts for r in e.results if r.fail_reason.startswith("rollout_error:")]
    assert errors and all("upstream exploded" in r.fail_reason and r.hard == 0 for r in errors)
    assert result.state.completed


def test_identical_candidate_is_served_from_the_score_cache(tmp_path):
    # every step proposes the same harmful rule: the first candidate is scored, the later ones are the same skill
    harm = json.dumps({"reasoning": "", "failure_summary": [],
                       "edits": [{"op": "append", "target": "", "content": "- Answer without checking your work."}]})
    # drop_rejected_edits 0: the screen would leave the edit out after two rejections (the step is skipped)
    result = Trainer(small_config(num_epochs=1, early_reject=False, drop_rejected_edits=0),
                     db=f"sqlite:///{tmp_path / 'c.db'}",
                     run_id="r", backend_factory=scripted_factory(optimizer=lambda p: harm)).train()
    events = [s.event for s in lineage_events(result.store, "r")]
    evaluated = [e for e in events if e.type == "CandidateEvaluated"]
    assert len(evaluated) >= 2 and not evaluated[0].cached
    assert all(e.cached and e.usage_by_role == {} for e in evaluated[1:])
    assert all(e.decision == "reject" for e in events if e.type == "GateDecided")


def test_an_early_rejected_candidate_is_never_cached_and_its_calls_are_reused(tmp_path):
    harm = json.dumps({"reasoning": "", "failure_summary": [],
                       "edits": [{"op": "append", "target": "", "content": "- Answer without checking your work."}]})
    result = Trainer(small_config(num_epochs=1), db=f"sqlite:///{tmp_path / 'c.db'}", run_id="r",
                     backend_factory=scripted_factory(optimizer=lambda p: harm)).train()
    evaluated = [s.event for s in lineage_events(result.store, "r") if s.type == "CandidateEvaluated"]
    assert len(evaluated) >= 2 and all(e.partial is not None and not e.cached for e in evaluated)
    # the same skill, the same order: the later evaluations are served the first one's calls
    assert all(e.usage_by_role == evaluated[0].usage_by_role for e in evaluated[1:])
    sent = [c.request_hash for c in result.store.read_calls("r") if c.role == "target"]
    assert len(sent) == len(set(sent))


def test_run_fork_audit_and_verify_on_every_backend(any_store):
    result = Trainer(small_config(num_epochs=1), store=any_store, run_id="r").train()
    assert result.state.completed and result.best_score >= result.baseline_score
    child = Trainer(store=any_store, run_id="r").fork(2, {"lr_scheduler": "constant"}, "c").train()
    assert child.state.completed and child.state.parent_run_id == "r"
    for run in ("r", "c"):
        assert audit(any_store, run).ok
        assert verify(any_store, run).ok
