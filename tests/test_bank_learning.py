"""How mode bank learns: distilled skills are gated at validation (a bank
that scores worse is rolled back), evolution is shown failures from train,
not from the split its bank is gated on, embedding retrieval gives every
task skills with the default (sim) embedder, a stage whose rollouts got no
skill is warned of, and runs written before these rules keep theirs."""

from __future__ import annotations

import json

import pytest
from conftest import slow_case, small_config

from skillstate.bank.document import read_bank
from skillstate.engine.runner import lineage_events
from skillstate.log.event_codec import decode
from skillstate.log.events_bank import BankValidated
from skillstate.log.reducer import FoldError, RunState, reduce
from skillstate.reading.audit import audit, verify
from skillstate.sim.world import bundled_splits
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

BANK = dict(mode="bank", num_epochs=2)


def _events(store: Store, run_id: str):
    return [s.event for s in lineage_events(store, run_id)]


def _train(tmp_path, run_id: str, on_progress=None, **kw):
    store = Store(f"sqlite:///{tmp_path / f'{run_id}.db'}")
    result = Trainer(small_config(**{**BANK, **kw}), store=store, run_id=run_id, on_progress=on_progress).train()
    return store, result


@pytest.mark.parametrize("seed", [42, slow_case(7), slow_case(2024)])  # a sample by default, all when slow
def test_the_bank_kept_after_each_validation_never_scores_lower_than_the_one_before(tmp_path, seed):
    """With gate_distillation (the default) the bank each validation leaves current scores at least what the
    bank last kept scored: distilled skills that made it worse are rolled back, and an evolved bank is kept only
    when the gate accepts it."""
    store, result = _train(tmp_path, "g", seed=seed, sim={"noise": "moderate"})
    state, kept_scores = RunState(), []
    for event in _events(store, "g"):
        before = state
        state = reduce(state, event)
        if isinstance(event, BankValidated):
            assert event.kept is not None and event.checked == before.bank_checked
            if event.kept is False:
                assert event.scores.gate < event.checked_score
                assert state.current_skill == event.checked and state.current_score == event.checked_score
                assert state.best_skill == before.best_skill  # a rolled-back bank is never the best
        if event.type == "GateDecided":
            kept_scores.append(state.current_score)
    assert kept_scores == sorted(kept_scores)
    assert audit(store, "g").ok and verify(store, "g").ok
    assert result.state.completed


def test_a_rolled_back_step_says_so(tmp_path):
    store, _ = _train(tmp_path, "r", seed=7, sim={"noise": "moderate"}, num_epochs=3)
    events = _events(store, "r")
    steps = {e.step for e in events if isinstance(e, BankValidated) and e.kept is False}
    assert steps, "no distillation made this run's bank worse: pick a seed where one does"
    reasons = {e.step: e.reason for e in events if e.type == "GateDecided"}
    assert all("rolled back" in reasons[s] for s in steps)


def test_evolution_is_shown_train_failures_not_the_split_it_is_gated_on(tmp_path):
    store, _ = _train(tmp_path, "e", seed=42)
    val = {item["id"] for item in bundled_splits()["val"]}
    events = _events(store, "e")
    batches = {e.step: set(e.batch_item_ids) for e in events if e.type == "StepStarted"}
    shown = [(e.step, ids) for e in events if e.type == "BankEvolved" for ids in e.samples.values()]
    assert shown, "evolution never ran"
    for step, ids in shown:
        assert set(ids) <= batches[step] and not set(ids) & val
    assert all(e.source == "train" for e in events if e.type == "BankEvolved")
    old, _ = _train(tmp_path, "v", seed=42, bank={"evolve_from": "val"})
    shown_val = [ids for e in _events(old, "v") if e.type == "BankEvolved" for ids in e.samples.values()]
    assert shown_val and all(set(ids) <= val for ids in shown_val)


def test_embedding_retrieval_gives_tasks_skills_with_the_default_embedder(tmp_path):
    store, result = _train(tmp_path, "m", seed=42, bank={"retrieval": "embedding"})
    given = total = 0
    state = RunState()
    for event in _events(store, "m"):
        if event.type == "RolloutCompleted" and read_bank(store.get_blob(state.progress.base_skill)).skills:
            total += len(event.results)
            given += sum(bool(r.retrieved) for r in event.results)
        state = reduce(state, event)
    assert total and given / total > 0.8
    assert result.summary["best_score"] > result.summary["baseline_score"]


def test_a_stage_whose_rollouts_got_no_skill_is_warned_of(tmp_path):
    warnings = []

    def on_progress(p):
        if p.kind == "warning":
            warnings.append(p.stage)

    _train(tmp_path, "w", on_progress=on_progress, seed=42,
           bank={"retrieval": "embedding", "similarity_threshold": 0.99, "min_retrieved": 0})
    assert warnings and all("was given a skill from the bank" in w for w in warnings)
    assert any("similarity_threshold" in w for w in warnings)
    quiet = []
    _train(tmp_path, "q", on_progress=lambda p: quiet.append(p.stage) if p.kind == "warning" else None, seed=42,
           bank={"retrieval": "embedding"})
    assert not [w for w in quiet if "given a skill" in w]


def test_runs_written_before_the_rules_keep_theirs():
    """A RunStarted (v10) or RunForked (v8) config without the keys meant the rules before them."""
    for kind, version in (("RunStarted", 10), ("RunForked", 8)):
        payload = {"config": {"mode": "bank", "bank": {"retrieval": "embedding"}}}
        bank = _upcast_config(kind, version, payload)["bank"]
        assert bank == {"retrieval": "embedding", "evolve_from": "val", "gate_distillation": False,
                        "min_retrieved": 0, "query_category": False, "mistakes_k": 0}
        kept = {"config": {"bank": {"evolve_from": "train", "min_retrieved": 3}}}
        assert _upcast_config(kind, version, kept)["bank"]["min_retrieved"] == 3


def _upcast_config(kind: str, version: int, payload: dict) -> dict:
    from skillstate.log.event_codec import UPCASTERS

    return UPCASTERS[(kind, version)](json.loads(json.dumps(payload)))["config"]


def test_a_rollback_needs_the_bank_it_restores():
    from skillstate.log.state import StepProgress
    from skillstate.log.values import Scores

    scores = Scores(hard=0.1, soft=0.1, gate=0.1, n=1)
    progress = StepProgress(step=2, epoch=1, batch_item_ids=(), edit_budget=1, base_skill="b")
    state = RunState(config={"mode": "bank"}, current_skill="b", progress=progress)
    with pytest.raises(FoldError):
        reduce(state, BankValidated(step=2, split="val", skill="b", scores=scores, kept=False))
    with pytest.raises(FoldError):
        reduce(state, BankValidated(step=2, split="val", skill="other", scores=scores))
    done = reduce(state, BankValidated(step=2, split="val", skill="b", scores=scores, kept=False, checked="a",
                                       checked_score=0.3))
    assert (done.current_skill, done.current_score, done.bank_checked) == ("a", 0.3, "a")
    assert decode("BankValidated", 1, json.loads(BankValidated(step=2, split="val", skill="b",
                                                               scores=scores).model_dump_json())).kept is None


def test_a_fork_that_changes_the_gate_metric_compares_banks_by_the_new_metric(tmp_path):
    """The bank last kept was scored under the parent's metric; the fork's rollback rule rescores it."""
    from skillstate.skillopt import gate as gate_rules

    store, _ = _train(tmp_path, "p", seed=7, sim={"noise": "moderate"}, bank={"validation_interval": 1})
    from skillstate.trainer import Trainer

    child = Trainer(store=store, run_id="p").fork(0, {"gate_metric": "soft"}, "c")
    child.train()
    state = RunState()
    checked = 0
    for event in _events(store, "c"):
        if isinstance(event, BankValidated) and event.checked is not None:
            before = state.score_cache[f"{event.split}:{event.checked}"]
            assert event.checked_score == gate_rules.gate_of(before, "soft", 0.5, 0.0)
            assert event.kept == (event.scores.gate >= event.checked_score)
            checked += 1
        state = reduce(state, event)
    assert checked


def test_runs_before_categorized_mistakes_read_their_teacher_as_they_did():
    """A reply whose mistakes are objects was unparseable for a run asking for bare lines, and still is."""
    from skillstate.engine.bank import LineMistakesReply, TeacherReply, parsed_reply
    from skillstate.llm.base import CallResult
    from skillstate.log.values import CallRef

    reply = '{"skills": [{"title": "t", "principle": "p"}], "mistakes": [{"text": "x", "category": null}]}'
    result = CallResult(ref=CallRef(request_hash="h", role="optimizer"), text=reply)
    assert parsed_reply(result, LineMistakesReply) == ("unparseable", None)
    status, parsed = parsed_reply(result, TeacherReply)
    assert status == "ok" and parsed.mistakes[0].text == "x"


def test_a_bank_read_back_keeps_its_mistakes_as_written():
    from skillstate.bank.document import bank_text

    for text in ('{"mistakes":["  "],"skills":[]}', '{"mistakes":["x  y"],"skills":[]}'):
        assert bank_text(read_bank(text)) == text


def test_an_evolution_with_no_failure_to_show_asks_no_teacher(tmp_path, monkeypatch):
    from skillstate.engine import bank as bank_stages

    monkeypatch.setattr(bank_stages, "_failure_pool", lambda ctx, state: [])  # a train batch with no failure
    store, _ = _train(tmp_path, "n", seed=42, bank={"evolution_threshold": 1.0})
    evolved = [e for e in _events(store, "n") if e.type == "BankEvolved"]
    assert evolved and all(e.status == "no_failures" and e.call is None and e.categories for e in evolved)
    distilled = [e for e in _events(store, "n") if e.type == "SkillsDistilled"]
    assert len([c for c in store.read_calls("n") if c.role == "optimizer"]) == len(distilled)
