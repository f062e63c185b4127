"""Everything the log says about one step, as one dict: the batch, the
failures, every analyst's patch, the merge, the kept edits with their apply
status, the candidate, its evaluation and the decision. `skillstate show
--step N` prints it and the dashboard's step page draws it."""

from __future__ import annotations

from typing import Any

from skillstate.engine.loading import LoadedRun, judged
from skillstate.errors import NotFoundError
from skillstate.log.events import (
    CandidateBuilt,
    CandidateEvaluated,
    EditsSelected,
    GateDecided,
    LearningRateChosen,
    PatchesMerged,
    PatchProposed,
    RolloutCompleted,
    StepStarted,
)
from skillstate.log.events_bank import BankEvolved, BankValidated, SkillsDistilled
from skillstate.log.events_blocker import BlockerSearched
from skillstate.log.events_check import CandidateChecked
from skillstate.log.events_pareto import ParentChosen
from skillstate.log.events_repair import EditsAblated
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.reading.bank_steps import step_label
from skillstate.reading.failures import event_call_refs, failed_calls
from skillstate.skillopt.describe import DESCRIBE
from skillstate.skillopt.tree_edits import is_skill_md_edit
from skillstate.skilltree import SKILL_MD
from skillstate.storage.store import Store


def _edit(e) -> dict[str, Any]:
    row = {"op": e.op, "target": e.target, "content": e.content, "source": e.source, "support": e.support}
    return {**row, "file": e.file} if e.file else row


def _file_of(e, describes: bool) -> str:
    """The file of a skill directory an edit changes: the one it names (a run that trains the whole
    directory), else SKILL.md (`describe`, where the run takes it, its description)."""
    if not is_skill_md_edit(e):
        return e.file
    return f"{SKILL_MD} (description)" if describes and e.op == DESCRIBE else SKILL_MD


def _bank_skill(skill) -> dict[str, Any]:
    return {"id": skill.id, "title": skill.title, "principle": skill.principle, "category": skill.category,
            "refines": skill.provenance.refines}


def rollout_checks(store: Store, results: list[Any]) -> list[dict[str, Any]]:
    """Each rolled-out item's checks with their verdicts and evidence (env evals), from its trajectory."""
    from skillstate.reading.grading import gradings

    found = gradings(store, results)
    out = []
    for r in results:
        grading = found.get(r.item_id, {})
        out.append({"item_id": r.item_id, "checks": [{"text": c["text"], "kind": c["kind"], "passed": c["passed"],
                                                       "evidence": c.get("evidence", "")}
                                                      for c in grading.get("checks", [])],
                    **({"judge_error": grading["judge_error"]} if grading.get("judge_error") else {})})
    return out


def step_detail(store: Store, loaded: LoadedRun, step: int) -> dict[str, Any]:
    stored = [s for s in loaded.lineage if s.step == step]
    events = [s.event for s in stored]
    if not events:
        raise NotFoundError(f"step {step} is beyond the end of run {loaded.run_id!r} "
                            f"(last completed step: {loaded.state.last_completed_step})")
    out: dict[str, Any] = {"run_id": loaded.run_id, "step": step,
                           "failed_calls": failed_calls(list(event_call_refs(store, stored)))}
    for ev in events:
        if isinstance(ev, StepStarted):
            out.update(epoch=ev.epoch, edit_budget=ev.edit_budget, batch=ev.batch_item_ids)
        elif isinstance(ev, RolloutCompleted):
            out["rollout"] = {
                "solved": sum(1 for r in ev.results if r.hard >= 1), "items": len(ev.results),
                "failures": [{"item_id": r.item_id, "task_type": r.task_type, "fail_reason": r.fail_reason}
                             for r in ev.results if r.hard < 1],
            }
            if judged(str(loaded.state.config.get("env", "qa"))):  # env evals: each item's checks and verdicts
                out["rollout"]["graded"] = rollout_checks(store, ev.results)
        elif isinstance(ev, PatchProposed):
            out.setdefault("patches", []).append({
                "source": ev.source, "minibatch": ev.minibatch, "status": ev.status, "items": ev.item_ids,
                "failure_summary": ev.failure_summary, "edits": [_edit(e) for e in ev.edits],
                "raw_reply": store.get_blob(ev.reply) if ev.reply else None,
                "error": ev.call.error if ev.call is not None else None,
            })
        elif isinstance(ev, PatchesMerged):
            out["merged"] = {"edits": [_edit(e) for e in ev.edits],
                             "merge_calls": [m.model_dump(exclude={"call"}) for m in ev.merges]}
        elif isinstance(ev, EditsSelected):
            merged = out.get("merged", {}).get("edits", [])
            tree = loaded.state.skill_tree is not None  # a skill directory: say which file each edit changes
            describes = loaded.state.config.get("disclosure") == "tools"
            out["selected"] = {"method": ev.method, "budget": ev.budget, "candidates": ev.candidates,
                               "indices": ev.selected_indices,
                               "edits": [{**_edit(e), **({"file": _file_of(e, describes)} if tree else {})}
                                         for e in ev.edits],
                               "dropped": [{"index": d.index, "reason": d.reason,
                                            **(merged[d.index] if d.index < len(merged) else {})}
                                           for d in ev.dropped],
                               **({"paired": ev.paired} if ev.paired else {})}
        elif isinstance(ev, LearningRateChosen):
            out["learning_rate"] = {"chosen": ev.chosen, "candidates": ev.candidates, "status": ev.status,
                                    "requested": ev.requested, "reasoning": ev.reasoning}
        elif isinstance(ev, (SkillsDistilled, BankEvolved)):
            key = "distilled" if isinstance(ev, SkillsDistilled) else "evolved"
            out[key] = {"status": ev.status, "added": [_bank_skill(x) for x in ev.added],
                        "dropped": [{"reason": x.reason, "similar_to": x.similar_to, "similarity": x.similarity,
                                     **_bank_skill(x.skill)} for x in ev.dropped]}
            if isinstance(ev, BankEvolved):
                out[key].update(rates=ev.rates, categories=ev.categories, samples=ev.samples)
            else:
                out[key].update(base_skill=ev.base_skill, skill=ev.skill)
        elif isinstance(ev, BankValidated):
            out["validated"] = {"split": ev.split, "gate": ev.scores.gate, "cached": ev.cached,
                                "by_category": {t: v.hard for t, v in ev.scores.by_task_type.items()},
                                "n_by_category": {t: v.n for t, v in ev.scores.by_task_type.items()}}
        elif isinstance(ev, EditsAblated):
            out["repair"] = repair_detail(ev)
        elif isinstance(ev, BlockerSearched):
            out["blocker"] = blocker_detail(ev)
        elif isinstance(ev, ParentChosen):  # parent_selection pareto
            out["parent"] = {"skill": ev.skill, "score": ev.score, "switched": ev.skill != ev.previous_skill,
                             "pool": ev.pool, "reason": ev.reason, "front": [m.model_dump() for m in ev.front]}
        elif isinstance(ev, ReviewRequested):  # review: the step put before a person
            out["review"] = {"review": ev.review, "verdict": ev.verdict.decision, "reason": ev.verdict.reason,
                             "candidate": ev.candidate, "edits": len(ev.edits)}
        elif isinstance(ev, ReviewDecided):
            out.setdefault("review", {}).update(decision=ev.decision, dropped=[i + 1 for i in ev.dropped],
                                                reviewer=ev.reviewer, at=ev.at, comment=ev.comment)
        elif isinstance(ev, CandidateBuilt) and out.get("review", {}).get("decision"):  # rebuilt after the review
            out["review"]["rebuilt"] = ev.skill
            out["review"]["apply_report"] = [r.model_dump() for r in ev.report]
            out["skills"]["kept"] = ev.skill
        elif isinstance(ev, CandidateEvaluated) and out.get("review", {}).get("decision"):
            out["review"]["evaluation"] = _evaluation(ev)
        elif isinstance(ev, CandidateBuilt) and "blocker" in out:  # the candidate without the line found
            out["blocker"]["apply_report"] = [r.model_dump() for r in ev.report]
            out["skills"]["searched"] = ev.skill
        elif isinstance(ev, CandidateEvaluated) and "blocker" in out:
            out["blocker"]["evaluation"] = _evaluation(ev)
        elif isinstance(ev, CandidateBuilt) and "repair" in out:  # the repaired candidate
            out["repair"]["apply_report"] = [r.model_dump() for r in ev.report]
            out["skills"]["repaired"] = ev.skill
        elif isinstance(ev, CandidateEvaluated) and "repair" in out:
            out["repair"]["evaluation"] = _evaluation(ev)
        elif isinstance(ev, CandidateBuilt):
            out["apply_report"] = [r.model_dump() for r in ev.report]
            out["skills"] = {"base": ev.base_skill, "candidate": ev.skill}
            out["candidate_changed"] = ev.changed
            out["update"] = {"method": ev.method, "status": ev.status, "block_restored": ev.block_restored}
        elif isinstance(ev, CandidateEvaluated):
            out["evaluation"] = _evaluation(ev)
        elif isinstance(ev, CandidateChecked):  # minibatch_gate
            out["checked"] = {"items": len(ev.item_ids), "parent_total": ev.parent_total,
                              "candidate_total": ev.candidate_total, "passed": ev.passed}
        elif isinstance(ev, GateDecided):
            out["decision"] = {"decision": ev.decision, "candidate_score": ev.candidate_score,
                               "current_score_before": ev.current_score, "best_score_before": ev.best_score,
                               "reason": ev.reason}
            if ev.paired is not None or ev.type_guard is not None:  # the robust rules' verdicts and numbers
                out["decision"].update(rule=ev.rule, paired=ev.paired.model_dump() if ev.paired else None,
                                       type_guard=ev.type_guard.model_dump() if ev.type_guard else None)
    if loaded.state.config.get("mode") == "bank":  # a bank step: what it did, instead of an edit budget
        out["bank_label"] = step_label(events)
    return out


def _evaluation(ev: CandidateEvaluated) -> dict[str, Any]:
    return {"split": ev.split, "hard": ev.scores.hard, "soft": ev.scores.soft, "gate": ev.scores.gate,
            "cached": ev.cached, "partial": ev.partial.model_dump(exclude={"item_ids"}) if ev.partial else None}


def blocker_detail(ev: BlockerSearched) -> dict[str, Any]:
    """The blocker search (blocker_search): the type searched, the line found, and the edit the screen left
    out that it put back (blocker_screened), if any."""
    top = ev.ablations[ev.found] if ev.found is not None else None
    return {"reason": ev.reason, "task_type": ev.task_type, "items": len(ev.item_ids),
            "ablations": len(ev.ablations), "found": None if top is None else {
                "line": top.line, "part": top.part, "lifted": top.lifted, **_edit(top.edit)},
            "screened": None if ev.screened_edit is None else {"index": ev.screened_index,
                                                                **_edit(ev.screened_edit)}}


def repair_detail(ev: EditsAblated) -> dict[str, Any]:
    """The repair (repair: ablate): the types lost, each ablated edit's outcome, the edits dropped."""
    return {"reason": ev.reason, "changes": ev.changes, "affected_types": ev.affected_types,
            "items": len(ev.item_ids), "current_score": ev.current_score, "candidate_score": ev.candidate_score,
            "dropped": ev.dropped, "trimmed": ev.trimmed, "repaired": ev.skill is not None,
            "ablations": [{"index": a.index, **_edit(a.edit), "part": a.part,
                           "kept_as": a.kept_as.content if a.kept_as is not None else None,
                           "score": a.score, "recovered": a.recovered, "harmful": a.harmful,
                           "dropped": a.harmful and a.index in ev.dropped,
                           "trimmed": a.harmful and a.index in ev.trimmed} for a in ev.ablations]}
