"""The repair stage (`repair: ablate`): after the candidate's evaluation,
find the kept edits that broke the task types it lost, and build the
candidate without them. The rollouts go through the run's executor and
journaled client like every other; the stage's one event (`EditsAblated`,
followed by the repaired `CandidateBuilt` when an edit is dropped) is
appended at once, so resume, replay and verify reproduce it. The pure
choices are in `skillstate.skillopt.repair`."""

from __future__ import annotations

import json
from typing import Any

from skillstate.config import SkillConfig
from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.engine.scoring import early_prefix, rollout_pairs
from skillstate.engine.update import patch_with
from skillstate.log.events import CandidateBuilt, Event, ItemResult
from skillstate.log.events_repair import EditAblation, EditsAblated
from skillstate.log.reducer import RunState, StepProgress, cache_key, need, step_progress
from skillstate.skillopt import repair as rules
from skillstate.skillopt.editor import CHANGED
from skillstate.skillopt.gate_robust import item_value


def due(cfg: SkillConfig, p: StepProgress) -> bool:
    """The repair stage comes next: on, a patch step whose changed candidate
    is evaluated, with at least two selected edits, not yet repaired."""
    return (rules.may_examine(cfg, p) and p.evaluation is not None and p.candidate is not None
            and p.candidate.changed)


def _results(ctx: RunContext, blob: str) -> dict[str, ItemResult]:
    return {r.item_id: r for r in (ItemResult.model_validate(x) for x in json.loads(ctx.blob(blob)))}


def ablate(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg = ctx.config
    evaluation, candidate = need(p.evaluation, "CandidateEvaluated"), need(p.candidate, "CandidateBuilt")
    edits = need(p.selected, "EditsSelected").edits
    split = evaluation.split
    common: dict[str, Any] = dict(step=p.step, split=split, candidate_skill=candidate.skill)
    current_skill = need(state.current_skill, "the current skill")
    key = cache_key(split, current_skill)
    reference = state.results_cache.get(key) or state.slow_results.get(key)
    if not reference:
        return [EditsAblated(changes={}, affected_types=[], item_ids=[], **common,
                             reason="the log holds no per-item results of the current skill to compare with")]
    current = _results(ctx, reference)
    cand = (_results(ctx, evaluation.results) if evaluation.results
            else gating.recorded_results(ctx, state, split, candidate.skill))
    rule = gating.rule_of(cfg)

    def value(r: ItemResult) -> float:
        return item_value(r.hard, r.soft, rule)

    scored = [i["id"] for i in ctx.env.items(split) if i["id"] in cand and i["id"] in current]
    if cfg.repair_prefix:  # the items early reject scores, whether it was on or not: the same repair either way
        prefix = set(early_prefix(ctx, state, split, candidate.skill, cand))
        scored = [i for i in scored if i in prefix]
    changes = rules.type_changes([(cand[i].task_type or "untyped", value(cand[i]), value(current[i]))
                                  for i in scored])
    affected = rules.affected_types(changes, cfg.repair_type_loss)
    if not affected:
        lost = any(-d > cfg.repair_type_loss for d in changes.values())
        why = "no task type gained" if lost else f"no task type lost more than {cfg.repair_type_loss:g}"
        return [EditsAblated(changes=changes, affected_types=[], item_ids=[], **common,
                             reason=f"{why} against the current skill: nothing to repair")]
    ids = [i for i in scored if (cand[i].task_type or "untyped") in affected]
    cand_values = [value(cand[i]) for i in ids]
    base = ctx.skill(p.base_skill)
    applied = [r.index for r in candidate.report if r.status in CHANGED]
    units = rules.choose_units(applied, edits, cfg.repair_max_edits, cfg.repair_clauses)
    scored_on: dict[str, Any] = dict(current_score=_mean([value(current[i]) for i in ids]),
                                     candidate_score=_mean(cand_values))
    if not units:
        return [EditsAblated(changes=changes, affected_types=affected, item_ids=ids, **common, **scored_on,
                             reason="fewer than two edits changed the skill: nothing to ablate")]
    variants = [edits[i] if k is None else rules.without_part(edits[i], k) for i, k in units]
    skills = [patch_with(cfg, base, [variants[u] if j == i else e for j, e in enumerate(edits)
                                     if not (j == i and k is None)])[0] for u, (i, k) in enumerate(units)]
    items = [ctx.env.item(i) for i in ids]
    done = rollout_pairs(ctx, [(skills[u], item) for u in range(len(units)) for item in items])
    by_unit = {u: done[u * len(items):(u + 1) * len(items)] for u in range(len(units))}
    found = rules.verdicts({u: [value(r) for r in rs] for u, rs in by_unit.items()}, cand_values, units)
    ablations = [EditAblation(index=units[v.index][0], edit=edits[units[v.index][0]], part=units[v.index][1],
                              kept_as=variants[v.index] if units[v.index][1] is not None else None,
                              skill=ctx.put_skill(skills[v.index]), results=by_unit[v.index],
                              score=_mean([value(r) for r in by_unit[v.index]]),
                              recovered=v.recovered, harmful=v.harmful) for v in found]
    harmful = [a for a in ablations if a.harmful]
    if not harmful:
        return [EditsAblated(changes=changes, affected_types=affected, item_ids=ids, ablations=ablations,
                             **common, **scored_on,
                             reason=f"no ablated edit stood out as recovering {', '.join(affected)}: the "
                                    "candidate is gated as it is")]
    culprit = harmful[0]
    dropped = [culprit.index] if culprit.part is None else []
    trimmed = {culprit.index: culprit.kept_as} if culprit.kept_as is not None else {}
    text, report, restored = patch_with(cfg, base, rules.repaired_edits(edits, dropped, trimmed))
    skill = ctx.put_skill(text)
    what = (f"dropped edit {culprit.index}" if culprit.part is None
            else f"left clause {culprit.part} out of edit {culprit.index}")
    event = EditsAblated(changes=changes, affected_types=affected, item_ids=ids, ablations=ablations,
                         dropped=dropped, trimmed=sorted(trimmed), skill=skill, **common, **scored_on,
                         reason=f"{what} of {len(edits)}: without it the {len(ids)} items of "
                                f"{', '.join(affected)} recovered the most")
    return [event, CandidateBuilt(step=p.step, base_skill=p.base_skill, skill=skill, changed=skill != p.base_skill,
                                  block_restored=restored, report=report, method="patch")]


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 9) if values else 0.0
