"""Work done ahead of time, in the background lane of the context, to keep
the concurrency cap full while the stage under way leaves it idle.

Nothing here becomes state: a rollout done ahead leaves only its calls in
the call table, and the stage that needs it later rolls the item out again
and is served those calls. The log stays the single truth, and resume and
verify are unaffected (verify reads only the calls events reference).

- `overlap_start`: while the baseline is scored, the first step's batch
  under the initial skill and, with `eval_test`, the test split under the
  initial skill (both are certain to be needed, so they share the cap with
  the baseline as equals, yielding only to a foreground task waiting);
- `speculative_rollout`: once a step's rollout is in, the next step's batch
  under the current skill, which is the next step's skill unless the gate
  accepts. It takes only slots the stage under way leaves idle (see
  `lanes`). Queued work for a skill that is no longer current is dropped
  when the next step starts; calls already sent then go unused."""

from __future__ import annotations

from typing import Any

from skillstate.engine.context import RunContext
from skillstate.engine.lanes import CERTAIN, SPECULATIVE
from skillstate.engine.scoring import prime_retrieval, rollout_one
from skillstate.engine.stages import step_batches
from skillstate.log.reducer import RunState

# The stages of a step after its rollout: the ones that leave the cap mostly idle, and the gate's.
AFTER_ROLLOUT = frozenset({"reflect", "aggregate", "learning_rate", "select", "update", "evaluate"})
START, NEXT_STEP = "start", "next_step"


def fetch(ctx: RunContext, state: RunState, stage: str) -> None:
    """Queue the work due ahead of `stage`, if any."""
    if state.kind != "train" or not ctx.background_clients:
        return
    cfg = ctx.config
    if stage == "start_step":
        ctx.cancel_ahead(lambda key: key[0] == NEXT_STEP and key[1] != state.current_skill)
    planned: list[tuple[str, str, dict[str, Any]]] = []
    step = 1  # the step whose batch is planned (the prime's key: the same skill may roll out the next batch too)
    if stage == "baseline" and cfg.overlap_start and state.start_skill:
        if state.total_steps >= 1:
            planned += [(START, cfg.train_split, ctx.env.item(i)) for b in step_batches(ctx, state, 1) for i in b]
        if cfg.eval_test:
            planned += [(START, cfg.test_split, item) for item in ctx.env.items(cfg.test_split)]
        skill, lane = state.start_skill, CERTAIN
    elif stage in AFTER_ROLLOUT and cfg.speculative_rollout and next_step_due(ctx, state):
        p = state.progress
        assert p is not None and state.current_skill is not None  # next_step_due checked both
        step = p.step + 1
        planned += [(NEXT_STEP, cfg.train_split, ctx.env.item(i)) for b in step_batches(ctx, state, step) for i in b]
        skill, lane = state.current_skill, SPECULATIVE
    if planned and cfg.mode == "bank":  # their retrievals' texts first, in batched requests (one per rollout else)
        ctx.fetch_ahead(lane, (planned[0][0], skill, f"retrieval for step {step}"), prime_ahead, ctx, skill,
                        [item for _, _, item in planned])
    for purpose, split, item in planned:
        ctx.fetch_ahead(lane, (purpose, skill, f"{split}:{item['id']}"), rollout_ahead, ctx, skill, item)


def next_step_due(ctx: RunContext, state: RunState) -> bool:
    """A step's rollout is in, another step follows, and no slow update,
    prune or parent draw can change the current skill in between."""
    p = state.progress
    if p is None or p.rollout is None or state.current_skill is None or p.step >= state.total_steps:
        return False
    spe = state.steps_per_epoch
    epoch_end = bool(spe) and p.step % spe == 0
    prune = ctx.config.prune == "step" or (ctx.config.prune == "epoch" and epoch_end)
    drawn = ctx.config.parent_selection != "current"  # the next step's parent is drawn after the gate
    budget = ctx.config.max_calls is not None  # whether another step starts is known only after this one
    return not (prune or drawn or budget or (ctx.config.use_slow_update and epoch_end and p.step // spe >= 2))


def prime_ahead(ctx: RunContext, skill: str, items: list[dict[str, Any]]) -> None:
    prime_retrieval(ctx, ctx.skill(skill), items)


def rollout_ahead(ctx: RunContext, skill: str, item: dict[str, Any]) -> None:
    rollout_one(ctx, ctx.skill(skill), item)
