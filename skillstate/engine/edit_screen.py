"""The minibatch screen (`edit_screen: minibatch`): before selection, each merged edit that would change
the skill is applied alone to the current skill and rolled out on a few items of the step's batch (see
`skillstate.skillopt.minibatch`); only the edits that pass compete for the budget, by what they gained,
and the ranking call is not made. Its rollouts are journaled calls like any other; its one event
(`EditsScreened`) is appended at once, so resume, replay and verify reproduce it."""

from __future__ import annotations

from typing import Any

from skillstate.config import SkillConfig
from skillstate.engine import gating
from skillstate.engine.blockers import patches_of
from skillstate.engine.context import RunContext
from skillstate.engine.scoring import check_rollout_errors, rollout_pairs
from skillstate.engine.update import patch_with, screen
from skillstate.log.events import Event, ItemResult
from skillstate.log.events_screen import EditsScreened, EditTried
from skillstate.log.reducer import RunState, StepProgress, need, step_progress
from skillstate.skillopt import blockers as blocker_rules
from skillstate.skillopt import minibatch as rules
from skillstate.skillopt.gate_robust import item_value


def due(cfg: SkillConfig, p: StepProgress) -> bool:
    """The screen comes next: on, a patch step (outside mode bank) whose edits are merged and not yet tried."""
    return (cfg.edit_screen != "off" and cfg.mode == "skill" and cfg.update_mode == "patch"
            and p.merged is not None and p.screened is None and p.selected is None)


def try_edits(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg = ctx.config
    edits = need(p.merged, "PatchesMerged").edits
    base = ctx.skill(p.base_skill)
    kept, _ = screen(cfg, state, base, edits)  # only the edits that would change the skill are tried
    if not kept:
        return [EditsScreened(step=p.step, reason="no merged edit would change the skill: nothing to try")]
    rule = gating.rule_of(cfg)

    def value(r: ItemResult) -> float:
        return item_value(r.hard, r.soft, rule)

    current = {r.item_id: r for r in need(p.rollout, "RolloutCompleted").results}
    batch = [(r.item_id, r.task_type or "untyped", value(r)) for r in current.values()]
    patches = patches_of(state)
    plans: list[dict[str, Any]] = []
    for i in kept:
        aims = blocker_rules.aimed_items(patches, [edits[i]])
        ids = rules.minibatch(aims, batch, cfg.edit_screen_items, cfg.seed, p.step, i, cfg.edit_screen_others)
        plans.append(dict(index=i, aimed=list(aims), ids=ids, skill=patch_with(cfg, base, [edits[i]])[0]))
    minibatches = [[(i, current[i].task_type or "untyped", value(current[i])) for i in plan["ids"]]
                   for plan in plans]
    got: dict[tuple[int, str], ItemResult] = {}
    if cfg.edit_screen_early:  # one failure of each aimed type first; the rest while the edit could still pass
        roll(ctx, plans, {n: rules.first_round(mb, plans[n]["aimed"]) for n, mb in enumerate(minibatches)}, got)
        rest: dict[int, list[str]] = {}
        for n, mb in enumerate(minibatches):
            so_far = [(t, value(got[n, i]), c) for i, t, c in mb if (n, i) in got]
            left = [(i, t, c) for i, t, c in mb if (n, i) not in got]
            if left and rules.may_pass(so_far, [(t, c) for _, t, c in left], plans[n]["aimed"]):
                rest[n] = [i for i, _, _ in left]
        roll(ctx, plans, rest, got)
    else:
        roll(ctx, plans, {n: list(plan["ids"]) for n, plan in enumerate(plans)}, got)
    check_rollout_errors(ctx, list(got.values()))  # the failure share over the stage's rollouts together
    tried = []
    for n, plan in enumerate(plans):
        ids = [i for i in plan["ids"] if (n, i) in got]
        results = [got[n, i] for i in ids]
        before = [value(current[i]) for i in ids]
        outcomes = [(current[i].task_type or "untyped", value(r), b) for i, r, b in zip(ids, results, before,
                                                                                          strict=True)]
        tried.append(EditTried(index=plan["index"], edit=edits[plan["index"]], aimed_types=plan["aimed"],
                               skill=ctx.put_skill(plan["skill"]), item_ids=ids, results=results,
                               left_out=[i for i in plan["ids"] if (n, i) not in got],
                               failed=sum(1 for v in before if v < 1),
                               gain=rules.net([value(r) for r in results], before),
                               passed=rules.passes(outcomes, plan["aimed"])))
    passed = sum(1 for t in tried if t.passed)
    return [EditsScreened(step=p.step, tried=tried,
                          reason=f"{passed} of {len(tried)} edits passed on their minibatches")]


def roll(ctx: RunContext, plans: list[dict[str, Any]], ids: dict[int, list[str]],
         got: dict[tuple[int, str], ItemResult]) -> None:
    """The items `ids` of each plan (by its position) rolled out with that plan's skill, at once, into `got`."""
    jobs = [(n, item_id) for n, some in ids.items() for item_id in some]
    if jobs:
        done = rollout_pairs(ctx, [(plans[n]["skill"], ctx.env.item(item_id)) for n, item_id in jobs])
        got.update(zip(jobs, done, strict=True))
