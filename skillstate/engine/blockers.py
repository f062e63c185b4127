"""The blocker search (`blocker_search: step`): after the candidate's evaluation (and the repair), when the
candidate does not beat the current skill and leaves a task type its edits were aimed at failing, find the
line of the current skill that holds that type down, and build the candidate without it. The rollouts go
through the run's executor and journaled client like every other; the stage's one event
(`BlockerSearched`, followed by the new `CandidateBuilt` when a line is found) is appended at once, so
resume, replay and verify reproduce it. The pure choices are in `skillstate.skillopt.blockers`.

Early reject stays exact: whether the search runs (the strict gate would reject) and on which items (the
type's items among those early reject scores, computed the same way from a full evaluation) are the same
with early reject on and off."""

from __future__ import annotations

import json
from typing import Any

from skillstate.config import SkillConfig
from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.engine.line_ablation import ablate, mean
from skillstate.engine.scoring import early_prefix
from skillstate.engine.update import patch_with
from skillstate.log.events import CandidateBuilt, Edit, Event, ItemResult
from skillstate.log.events_blocker import BlockerSearched
from skillstate.log.reducer import RunState, need, step_progress
from skillstate.skillopt import blockers as rules
from skillstate.skillopt import repair as repair_rules
from skillstate.skillopt.gate_robust import item_value
from skillstate.skillopt.guidance import body_of
from skillstate.skillopt.prune import content_lines, whole_line_first
from skillstate.skillopt.tree_edits import md_of


def due(cfg: SkillConfig, state: RunState) -> bool:
    """The search comes next: on, a patch step whose changed candidate is evaluated, not searched yet, and
    the strict gate would reject it (rejected early, or scoring no more than the current skill)."""
    p = state.progress
    if (cfg.blocker_search == "off" or cfg.mode != "skill" or cfg.update_mode != "patch" or not cfg.use_gate
            or p is None or p.blocker is not None or p.evaluation is None or p.candidate is None
            or not p.candidate.changed or p.selected is None or state.current_score is None):
        return False
    return p.evaluation.partial is not None or p.evaluation.scores.gate <= state.current_score


def _results(ctx: RunContext, blob: str) -> dict[str, ItemResult]:
    return {r.item_id: r for r in (ItemResult.model_validate(x) for x in json.loads(ctx.blob(blob)))}


def kept_edits(state: RunState) -> list:
    """The step's selected edits the candidate still applies, as proposed (the repair's drops left out)."""
    p = step_progress(state)
    gone = set(p.repair.dropped) if p.repair is not None else set()
    return [e for i, e in enumerate(need(p.selected, "EditsSelected").edits) if i not in gone]


def patches_of(state: RunState) -> list[rules.Patch]:
    """The step's failure analysts' patches as the aims read them: edits, failures shown, summary lines."""
    p = step_progress(state)
    types = {r.item_id: r.task_type or "untyped" for r in need(p.rollout, "RolloutCompleted").results
             if r.hard < 1}
    return [(x.edits, [(i, types[i]) for i in x.item_ids if i in types], x.failure_summary) for x in p.patches
            if x.source == "failure" and x.status == "ok"]


def aimed(state: RunState) -> list[str]:
    """The types the step's kept edits were aimed at, from its failure analysts' patches."""
    return rules.aimed_types(patches_of(state), kept_edits(state))


def screened_back(state: RunState, outcomes: list[tuple[str, float]]) -> tuple[int, Edit, str] | None:
    """`blocker_screened`: the edit the screen left out to put back (its merged index, the edit) and the type
    to search, or None."""
    p = step_progress(state)
    if p.screened is None:
        return None
    kept = need(p.selected, "EditsSelected").selected_indices
    tried = [(t.index, t.aimed_types, t.gain, t.passed) for t in p.screened.tried]
    found = rules.screened_out(tried, outcomes, kept)
    if found is None:
        return None
    index, task_type = found
    return index, next(t.edit for t in p.screened.tried if t.index == index), task_type


def search(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg = ctx.config
    evaluation, candidate = need(p.evaluation, "CandidateEvaluated"), need(p.candidate, "CandidateBuilt")
    split = evaluation.split
    targets = aimed(state)
    common: dict[str, Any] = dict(step=p.step, split=split, candidate_skill=candidate.skill, aimed_types=targets)
    current_skill = need(state.current_skill, "the current skill")
    if not targets and not cfg.blocker_screened:
        return [BlockerSearched(**common, reason="no kept edit came from a failure analyst: no type to search")]
    cand = (_results(ctx, evaluation.results) if evaluation.results
            else gating.recorded_results(ctx, state, split, candidate.skill))
    rule = gating.rule_of(cfg)

    def value(r: ItemResult) -> float:
        return item_value(r.hard, r.soft, rule)

    prefix = set(early_prefix(ctx, state, split, candidate.skill, cand))  # the same with early reject on or off
    scored = [(i["id"], cand[i["id"]].task_type or "untyped", value(cand[i["id"]])) for i in ctx.env.items(split)
              if i["id"] in prefix]
    stuck = rules.stuck_types(targets, [(t, v) for _, t, v in scored])
    back = screened_back(state, [(t, v) for _, t, v in scored]) if not stuck and cfg.blocker_screened else None
    if back is not None:
        stuck = [back[2]]
        common.update(screened_index=back[0], screened_edit=back[1])
    elif not targets:
        return [BlockerSearched(**common, reason="no kept edit came from a failure analyst, and no edit the "
                                                 "screen left out was aimed at a type left failing: no type to "
                                                 "search")]
    if not stuck:
        return [BlockerSearched(**common, reason=f"the candidate left none of {', '.join(targets)} failing")]
    task_type = stuck[0]
    ids = rules.stuck_items(scored, task_type, cfg.blocker_items)
    cand_values = [value(cand[i]) for i in ids]
    common.update(stuck_types=stuck, task_type=task_type, item_ids=ids, candidate_score=mean(cand_values))
    base_md, cand_md = md_of(ctx.skill(current_skill)), md_of(ctx.skill(candidate.skill))
    cand_body = body_of(cand_md, front_matter=cfg.protect_front_matter)
    lines = [ln for ln in dict.fromkeys(content_lines(body_of(base_md, front_matter=cfg.protect_front_matter)))
             if whole_line_first(cand_body, ln)]
    if not lines:
        return [BlockerSearched(**common, reason="the candidate keeps no line of the current skill to remove")]
    edits = repair_rules.applied_after(need(p.selected, "EditsSelected").edits, p.repair)
    if back is not None:  # the current skill with the edit put back alone: the kept edits lost at the gate
        edits = [back[1]]
    base = ctx.skill(p.base_skill)
    done = ablate(ctx, state, task_type, lines, ids, cand_values,
                  lambda removals: patch_with(cfg, base, [*edits, *removals])[0], group_first=True)
    ablations, chosen = done.ablations, done.chosen
    if done.group is not None:
        common["group"] = done.group
    if done.group is not None and not ablations:
        return [BlockerSearched(**common, reason=f"without all {len(done.group.lines)} searched lines of one "
                                                 f"clause at once, the {len(ids)} failed items of {task_type} "
                                                 f"gained only {done.group.lifted:+g}: no blocker among them")]
    if chosen is None:
        return [BlockerSearched(**common, ablations=ablations,
                                reason=f"no line of the current skill stood out as holding {task_type} down "
                                       f"({len(ablations)} ablations on {len(ids)} items)")]
    top = ablations[chosen]
    text, report, restored = patch_with(cfg, base, [*edits, top.edit])
    skill = ctx.put_skill(text)
    what = "line" if top.part is None else f"clause {top.part} of the line"
    put_back = "" if back is None else f", with edit {back[0]} the screen left out alone,"
    event = BlockerSearched(**common, ablations=ablations, found=chosen, skill=skill,
                            reason=f"without the {what} {top.line[:60]!r}{put_back} the {len(ids)} failed items "
                                   f"of {task_type} gained {top.lifted:+g}")
    return [event, CandidateBuilt(step=p.step, base_skill=p.base_skill, skill=skill, changed=skill != p.base_skill,
                                  block_restored=restored, report=report, method="patch")]


def gate_note(state: RunState) -> str:
    """What the gate's reason adds when the search removed a line."""
    b = step_progress(state).blocker
    if b is None or b.found is None:
        return ""
    note = rules.note(b.ablations[b.found].line, b.task_type, b.ablations[b.found].lifted)
    return note if b.screened_index is None else f"{note}, with edit {b.screened_index} the screen left out alone"
