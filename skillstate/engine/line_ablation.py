"""Ablating lines of the current skill on one task type's failed items: the rollouts both the step's blocker
search (`blocker_search`) and the prune's test of the lowest type (`prune_blockers`) make. Which lines, in
what order, and which ablation names a blocker are the pure rules of `skillstate.skillopt.blockers`.

With `blocker_ablation: group` the ablations are rolled out a few stuck items at a time, all of them
together, and an ablation stops once neither it nor (with `blocker_stop_by_line`) another ablation of its
line could still lift half the items even if it won every item left (the line could not be named then); the
step's search first rolls out the candidate without every searched line of one clause at once, and ablates
those one by one only when that lifts half the items (a line of several clauses is always ablated whole and
clause by clause). `each` (runs logged before `group`
was the default) rolls out every ablation on every item."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.engine.scoring import check_rollout_errors, rollout_pairs
from skillstate.log.events import Edit, ItemResult
from skillstate.log.events_blocker import GroupAblation, LineAblation
from skillstate.log.reducer import RunState, cache_key, need
from skillstate.skillopt import blockers as rules
from skillstate.skillopt.gate_robust import item_value
from skillstate.skillopt.tree_edits import md_of


@dataclass(frozen=True)
class Ablated:
    ablations: list[LineAblation]
    chosen: int | None  # the ablation that names the blocker
    group: GroupAblation | None = None  # blocker_ablation group with `group_first`: the one-clause lines at once


def ablate(ctx: RunContext, state: RunState, task_type: str, lines: list[str], ids: list[str],
           before: list[float], build: Callable[[list[Edit]], str], group_first: bool = False) -> Ablated:
    """Each of `lines` (the most suspect first, at most blocker_max_lines, whole and by clause) removed by
    `build` (removal edits -> the skill without them) and rolled out on the items `ids`, whose values without
    any removal are `before`; with the verdict. With `blocker_ablation: group`, ablations stop early and,
    when `group_first`, the searched lines of one clause are first removed all at once."""
    cfg = ctx.config
    rule = gating.rule_of(cfg)

    def value(r: ItemResult) -> float:
        return item_value(r.hard, r.soft, rule)

    order = rules.suspicion(lines, md_of(ctx.skill(need(state.start_skill, "the initial skill"))).splitlines(),
                            changes(ctx, state, task_type))
    found_units = rules.units(lines, order, cfg.blocker_max_lines)
    removals = [rules.deletion(lines[i], k) for i, k in found_units]
    items = [ctx.env.item(i) for i in ids]
    stepwise = cfg.blocker_ablation == "group"
    group = None
    if stepwise and group_first and (single := rules.single_clause_lines(lines, found_units)):
        # the lines of one clause first, all at once; a line of several clauses is always searched clause by
        # clause (its blocker may share the line with the type's own rule, which the group would remove too)
        whole = build([rules.deletion(lines[i], None) for i in single])
        [rolled] = roll(ctx, [whole], items, before, value, stepwise=True)
        lifted = round(rules.lift([value(r) for r in rolled], before[:len(rolled)]), 9)
        group = GroupAblation(lines=[lines[i] for i in single], skill=ctx.put_skill(whole), results=rolled,
                              score=mean([value(r) for r in rolled]), lifted=lifted)
        if not rules.group_lifts(lifted, len(ids)):
            found_units = [u for u in found_units if u[0] not in set(single)]
            removals = [rules.deletion(lines[i], k) for i, k in found_units]
            if not found_units:
                return Ablated([], None, group)
    skills = [build([removal]) for removal in removals]
    by_unit = roll(ctx, skills, items, before, value, stepwise=stepwise,
                   lines=[i for i, _ in found_units] if cfg.blocker_stop_by_line else None)
    lifts = [round(rules.lift([value(r) for r in rs], before[:len(rs)]), 9) for rs in by_unit]
    ablations = [LineAblation(line=lines[i], part=k, edit=removals[u], skill=ctx.put_skill(skills[u]),
                              results=by_unit[u], score=mean([value(r) for r in by_unit[u]]), lifted=lifts[u])
                 for u, (i, k) in enumerate(found_units)]
    return Ablated(ablations, rules.verdict(lifts, found_units, len(ids)), group)


def roll(ctx: RunContext, skills: list[str], items: list[dict], before: list[float],
         value: Callable[[ItemResult], float], stepwise: bool,
         lines: list[int] | None = None) -> list[list[ItemResult]]:
    """Each of `skills` rolled out on `items`: all at once, or (`stepwise`) a few items at a time (about ROUND
    rollouts a round) for every skill still able to lift half the items, or (with `lines`, the line each skill
    removes) whose line has one still able to (`rules.live`), the others stopped."""
    if not stepwise:
        done = rollout_pairs(ctx, [(skill, item) for skill in skills for item in items])
        return [done[u * len(items):(u + 1) * len(items)] for u in range(len(skills))]
    out: list[list[ItemResult]] = [[] for _ in skills]
    live, at = list(range(len(skills))), 0
    while live and at < len(items):
        width = max(1, ROUND // len(live))  # items this round, so a round sends about ROUND calls
        jobs = [(u, item) for u in live for item in items[at:at + width]]
        done = rollout_pairs(ctx, [(skills[u], item) for u, item in jobs])
        for (u, _), r in zip(jobs, done, strict=True):
            out[u].append(r)
        at += width
        going = set(rules.live([[value(r) for r in rs] for rs in out], before, lines))
        live = [u for u in live if u in going]
    check_rollout_errors(ctx, [r for rs in out for r in rs])  # the failure share over all of them, as `each`
    return out


ROUND = 8  # blocker_ablation group: about this many rollouts per round (a fixed number, so the calls made
#            do not depend on the run's concurrency)


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
