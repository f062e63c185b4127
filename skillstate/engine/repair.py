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
from skillstate.engine.stages import check_rollout_errors, rollout_one
from skillstate.engine.update import patch_skill
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
    base = ctx.blob(p.base_skill)
    applied = [r.index for r in candidate.report if r.status in CHANGED]
    chosen = rules.choose_ablations(applied, {i: e.support for i, e in enumerate(edits)}, cfg.repair_max_edits)
    scored_on: dict[str, Any] = dict(current_score=_mean([value(current[i]) for i in ids]),
                                     candidate_score=_mean(cand_values))
    if not chosen:
        return [EditsAblated(changes=changes, affected_types=affected, item_ids=ids, **common, **scored_on,
                             reason="fewer than two edits changed the skill: nothing to ablate")]
    skills = {i: patch_skill(base, [e for j, e in enumerate(edits) if j != i])[0] for i in chosen}
    items = [ctx.env.item(i) for i in ids]
    jobs = [(i, item) for i in chosen for item in items]
    ctx.expect_calls(ctx.rollout_calls(len(jobs)))
    done = ctx.map(lambda job: rollout_one(ctx, skills[job[0]], job[1]), jobs)
    check_rollout_errors(ctx, done)
    by_edit = {i: done[k * len(items):(k + 1) * len(items)] for k, i in enumerate(chosen)}
    found = rules.verdicts({i: [value(r) for r in rs] for i, rs in by_edit.items()}, cand_values)
    ablations = [EditAblation(index=v.index, edit=edits[v.index], skill=ctx.put_blob(skills[v.index]),
                              results=by_edit[v.index], score=_mean([value(r) for r in by_edit[v.index]]),
                              recovered=v.recovered, harmful=v.harmful) for v in found]
    dropped = rules.to_drop(found)
    if not dropped:
        return [EditsAblated(changes=changes, affected_types=affected, item_ids=ids, ablations=ablations,
                             **common, **scored_on,
                             reason=f"no ablated edit stood out as recovering {', '.join(affected)}: the "
                                    "candidate is gated as it is")]
    kept = [edits[i] for i in rules.kept_edits(len(edits), dropped)]
    text, report, restored = patch_skill(base, kept)
    skill = ctx.put_blob(text)
    event = EditsAblated(changes=changes, affected_types=affected, item_ids=ids, ablations=ablations,
                         dropped=dropped, skill=skill, **common, **scored_on,
                         reason=f"dropped edit {dropped[0]} of {len(edits)}: without it the {len(ids)} items of "
                                f"{', '.join(affected)} recovered the most")
    return [event, CandidateBuilt(step=p.step, base_skill=p.base_skill, skill=skill, changed=skill != p.base_skill,
                                  block_restored=restored, report=report, method="patch")]


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 9) if values else 0.0
