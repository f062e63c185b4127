"""Ablating lines of the current skill on one task type's failed items: the rollouts both the step's blocker
search (`blocker_search`) and the prune's test of the lowest type (`prune_blockers`) make. Which lines, in
what order, and which ablation names a blocker are the pure rules of `skillstate.skillopt.blockers`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.engine.scoring import check_rollout_errors, rollout_one
from skillstate.log.events import Edit, ItemResult
from skillstate.log.events_blocker import LineAblation
from skillstate.log.reducer import RunState, cache_key, need
from skillstate.skillopt import blockers as rules
from skillstate.skillopt.gate_robust import item_value
from skillstate.skillopt.tree_edits import md_of


@dataclass(frozen=True)
class Ablated:
    ablations: list[LineAblation]
    chosen: int | None  # the ablation that names the blocker


def ablate(ctx: RunContext, state: RunState, task_type: str, lines: list[str], ids: list[str],
           before: list[float], build: Callable[[Edit], str]) -> Ablated:
    """Each of `lines` (the most suspect first, at most blocker_max_lines, whole and by clause) removed by
    `build` (removal edit -> the skill without it) and rolled out on the items `ids`, whose values without
    any removal are `before`; with the verdict."""
    cfg = ctx.config
    rule = gating.rule_of(cfg)

    def value(r: ItemResult) -> float:
        return item_value(r.hard, r.soft, rule)

    order = rules.suspicion(lines, md_of(ctx.skill(need(state.start_skill, "the initial skill"))).splitlines(),
                            changes(ctx, state, task_type))
    found_units = rules.units(lines, order, cfg.blocker_max_lines)
    removals = [rules.deletion(lines[i], k) for i, k in found_units]
    skills = [build(removal) for removal in removals]
    items = [ctx.env.item(i) for i in ids]
    jobs = [(u, item) for u in range(len(found_units)) for item in items]
    ctx.expect_calls(ctx.rollout_calls(len(jobs)))
    done = ctx.map(lambda job: rollout_one(ctx, skills[job[0]], job[1]), jobs)
    check_rollout_errors(ctx, done)
    by_unit = [done[u * len(items):(u + 1) * len(items)] for u in range(len(found_units))]
    lifts = [round(rules.lift([value(r) for r in rs], before), 9) for rs in by_unit]
    ablations = [LineAblation(line=lines[i], part=k, edit=removals[u], skill=ctx.put_skill(skills[u]),
                              results=by_unit[u], score=mean([value(r) for r in by_unit[u]]), lifted=lifts[u])
                 for u, (i, k) in enumerate(found_units)]
    return Ablated(ablations, rules.verdict(lifts, found_units, len(ids)))


def changes(ctx: RunContext, state: RunState, task_type: str) -> list[tuple[list[str], float]]:
    """Each skill made current in turn (its lines) and the change of `task_type`'s val score it brought."""
    split, rule = ctx.config.val_split, gating.rule_of(ctx.config)
    out: list[tuple[list[str], float]] = []
    skill = state.start_skill
    for rec in state.history:
        if rec.current_skill and rec.current_skill != skill:
            before = state.score_cache.get(cache_key(split, skill or ""))
            after = state.score_cache.get(cache_key(split, rec.current_skill))
            change = rules.by_type_change(gating.by_type(before, rule) if before else None,
                                          gating.by_type(after, rule) if after else None, task_type)
            out.append((md_of(ctx.skill(rec.current_skill)).splitlines(), change))
        skill = rec.current_skill
    return out


def mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 9) if values else 0.0
