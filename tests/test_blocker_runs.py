"""The blocker search (`blocker_search: step`) and the minibatch screen (`edit_screen: minibatch`) in real
runs on the sim's blocking mode: a line planted in the initial skill that pins a task type low is found,
removed and gated; replay --verify, audit and forks from before and after the search stay exact; and
early reject changes no decision, no search and no screen."""

from __future__ import annotations

import json

import pytest
from conftest import small_config
from run_helpers import call, log_of

from skillstate.engine.runner import lineage_events
from skillstate.log.event_codec import decode
from skillstate.reading.audit import audit, verify
from skillstate.sim.world import bundled_skill
from skillstate.trainer import Trainer

BLOCKER = "- Keep answers terse: repeat lists exactly as given; never reformat or reorder them."


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A one-epoch run whose initial skill holds a line that blocks list ordering (seed 1 finds it at step 3;
    with `eval_order: hardness` the repair's drop lets step 3 pass without the search)."""
    path = tmp_path_factory.mktemp("blocker")
    skill = path / "planted.md"
    skill.write_text(bundled_skill().replace("- Always answer with a single word.\n", "") + BLOCKER + "\n",
                     encoding="utf-8")
    db = f"sqlite:///{path / 'b.db'}"
    cfg = small_config(seed=1, num_epochs=1, initial_skill=str(skill), sim={"noise": "blocking"},
                       blocker_search="step", eval_order="failed_first")
    result = Trainer(cfg, db=db, run_id="p").train()
    return db, result


def test_the_search_finds_the_planted_line_and_the_gate_takes_the_candidate_without_it(planted):
    db, result = planted
    log = log_of(db, "p")
    searched = [e["payload"] for e in log if e["type"] == "BlockerSearched"]
    found = [s for s in searched if s["found"] is not None]
    assert found, "the planted line was not found"
    hit = found[0]
    top = hit["ablations"][hit["found"]]
    assert top["line"] == BLOCKER and hit["task_type"] == "list_ordering"
    if top["part"] is not None:  # the clause that overrides the rule, the rest of the line kept
        assert "never reformat" not in top["edit"]["content"] and top["edit"]["op"] == "replace"
    assert top["lifted"] >= len(hit["item_ids"]) / 2
    assert all(a["lifted"] < top["lifted"] for a in hit["ablations"] if a["line"] != BLOCKER)
    for a in hit["ablations"]:  # each ablation rolled out on the stuck items, every rollout a journaled call
        ids = [r["item_id"] for r in a["results"]]  # (blocker_ablation group: stopped once it could not lift half)
        assert ids and ids == hit["item_ids"][:len(ids)] and all(r["call"] for r in a["results"])
        n = len(hit["item_ids"])  # the stuck items scored 0, so winning every item left adds one each
        assert len(ids) == n or 2 * (a["lifted"] + n - len(ids)) < n
    assert len(top["results"]) == len(hit["item_ids"])
    group = hit["group"]  # first every searched line of one clause at once; the planted line has two
    assert group is not None and BLOCKER not in group["lines"]
    step = [e for e in log if e["payload"].get("step") == hit["step"]]
    kinds = [e["type"] for e in step]
    at = kinds.index("BlockerSearched")
    assert kinds[at + 1:] == ["CandidateBuilt", "CandidateEvaluated", "GateDecided"]  # gated like any candidate
    assert step[at + 1]["payload"]["skill"] == hit["skill"]
    gate = step[-1]["payload"]
    assert gate["decision"] in ("accept", "accept_best") and "unblocked list_ordering" in gate["reason"]
    assert "never reformat or reorder" not in result.best_skill
    assert "blocker" in json.loads(call("show", "p", "--json", "--db", db))["usage_by_stage"]
    report = verify(result.store, "p")
    assert report.ok and report.checked == report.total
    assert audit(result.store, "p").ok


def test_forks_from_before_and_after_the_search_verify_and_repeat_it(planted):
    db, _ = planted
    step = next(e["payload"]["step"] for e in log_of(db, "p")
                if e["type"] == "BlockerSearched" and e["payload"]["found"] is not None)
    call("fork", "p", f"step_{step - 1}", "--run-id", "before", "-q", "--db", db)
    call("fork", "p", f"step_{step}", "--run-id", "after", "-q", "--db", db)
    call("fork", "p", f"step_{step - 1}", "--set", "blocker_search=off", "--run-id", "off", "-q", "--db", db)
    parent = [e for e in log_of(db, "p") if e["type"] == "BlockerSearched" and e["payload"]["step"] == step]
    again = [e for e in log_of(db, "before") if e["type"] == "BlockerSearched" and e["payload"]["step"] == step]
    assert [e["payload"] for e in again] == [e["payload"] for e in parent]  # the same search, from the journal
    assert not [e for e in log_of(db, "off") if e["type"] == "BlockerSearched"]
    for run in ("before", "after", "off"):
        assert "reproduces all" in call("replay", run, "--verify", "--db", db)
        assert "intact" in call("audit", run, "--db", db)


@pytest.mark.parametrize("seed", [2, 5])
def test_early_reject_changes_no_decision_search_or_screen(tmp_path, seed):
    def run(on: bool):
        cfg = small_config(seed=seed, num_epochs=1, early_reject=on, sim={"noise": "blocking"},
                           blocker_search="step", edit_screen="minibatch", use_step_buffer=False)
        return Trainer(cfg, db=f"sqlite:///{tmp_path / f'{seed}-{on}.db'}", run_id="r").train()

    on, off = run(True), run(False)
    events = lambda r: [s.event for s in lineage_events(r.store, "r")]  # noqa: E731
    decisions = lambda r: [(e.step, e.decision) for e in events(r) if e.type == "GateDecided"]  # noqa: E731
    searches = lambda r: [(e.step, e.task_type, e.item_ids, e.found, e.skill) for e in events(r)  # noqa: E731
                          if e.type == "BlockerSearched"]
    screens = lambda r: [(e.step, [(t.index, t.item_ids, t.passed) for t in e.tried]) for e in events(r)  # noqa: E731
                         if e.type == "EditsScreened"]
    assert decisions(on) == decisions(off)
    assert searches(on) == searches(off) and screens(on) == screens(off)
    assert any(e.type == "EditsScreened" and e.tried for e in events(on))
    report = verify(on.store, "r")
    assert report.ok and report.checked == report.total


def test_trying_edits_on_their_first_failures_first_passes_the_same_edits_for_fewer_calls(tmp_path):
    def run(early: bool):
        cfg = small_config(seed=2, num_epochs=1, sim={"noise": "blocking"}, edit_screen="minibatch",
                           edit_screen_early=early, use_step_buffer=False)
        return Trainer(cfg, db=f"sqlite:///{tmp_path / f'{early}.db'}", run_id="r").train()

    early, whole = run(True), run(False)
    events = lambda r: [s.event for s in lineage_events(r.store, "r")]  # noqa: E731
    tried = lambda r: [t for e in events(r) if e.type == "EditsScreened" for t in e.tried]  # noqa: E731
    kept = lambda r: [(e.type, e.model_dump(exclude={"usage_by_role"})) for e in events(r)  # noqa: E731
                      if e.type in ("EditsSelected", "GateDecided")]
    assert kept(early) == kept(whole)  # the same selections and decisions
    assert [(t.index, t.passed) for t in tried(early)] == [(t.index, t.passed) for t in tried(whole)]
    for a, b in zip(tried(early), tried(whole), strict=True):
        assert sorted(a.item_ids + a.left_out) == sorted(b.item_ids) and not b.left_out
        if a.passed:  # tried on its whole minibatch: the same gain
            assert a.item_ids == b.item_ids and a.gain == b.gain
    assert any(t.left_out for t in tried(early))
    assert sum(len(t.item_ids) for t in tried(early)) < sum(len(t.item_ids) for t in tried(whole))
    assert verify(early.store, "r").ok
    started = {"config": {"num_epochs": 1}, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f",
               "prompts": {}, "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    old = decode("RunStarted", 14, started).config  # logged before: the whole minibatch, ablations stopped alone
    assert old["edit_screen_early"] is False and old["blocker_stop_by_line"] is False
    assert "edit_screen_early" not in decode("RunStarted", 15, started).config  # a new run's defaults apply


def test_blocker_ablation_each_rolls_every_ablation_out_on_every_item_and_finds_the_same_line(tmp_path):
    skill = tmp_path / "planted.md"
    skill.write_text(bundled_skill().replace("- Always answer with a single word.\n", "") + BLOCKER + "\n",
                     encoding="utf-8")
    cfg = small_config(seed=1, num_epochs=1, initial_skill=str(skill), sim={"noise": "blocking"},
                       blocker_search="step", eval_order="failed_first", blocker_ablation="each")
    result = Trainer(cfg, db=f"sqlite:///{tmp_path / 'e.db'}", run_id="e").train()
    searched = [s.event for s in lineage_events(result.store, "e") if s.event.type == "BlockerSearched"]
    hit = next(s for s in searched if s.found is not None)
    assert hit.ablations[hit.found].line == BLOCKER and hit.group is None
    assert all([r.item_id for r in a.results] == s.item_ids for s in searched for a in s.ablations)
    assert verify(result.store, "e").ok


def test_a_run_logged_before_group_ablation_and_hardness_reads_each_and_failed_first():
    from skillstate.log.event_codec import decode

    config = {"num_epochs": 1}
    started = {"config": config, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f", "prompts": {},
               "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    old = decode("RunStarted", 12, started).config
    assert old["blocker_ablation"] == "each" and old["eval_order"] == "failed_first"
    kept = decode("RunStarted", 12, {**started, "config": {**config, "eval_order": "split"}}).config
    assert kept["eval_order"] == "split"
    assert "blocker_ablation" not in decode("RunStarted", 13, started).config  # a new run's defaults apply
    forked = {"parent_run_id": "p", "fork_step": 1, "parent_event_count": 3, "parent_event_hash": "h",
              "overrides": {}, "config": config, "prompts": {}, "steps_per_epoch": 1, "total_steps": 1}
    assert decode("RunForked", 10, forked).config["blocker_ablation"] == "each"


def test_the_defaults_screen_edits_and_mode_bank_leaves_the_document_mechanisms_off():
    from pydantic import ValidationError

    from skillstate.config import SkillConfig

    cfg = SkillConfig()
    assert (cfg.edit_screen, cfg.edit_screen_fallback, cfg.blocker_search, cfg.prune, cfg.prune_blockers) == \
        ("minibatch", "rank", "step", "epoch", False)
    bank = SkillConfig(mode="bank")
    assert (bank.edit_screen, bank.blocker_search, bank.prune, bank.prune_blockers) == ("off", "off", "off", False)
    with pytest.raises(ValidationError, match="edit_screen does not apply"):
        SkillConfig(mode="bank", edit_screen="minibatch")
