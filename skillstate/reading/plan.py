"""What a run will ask for before it starts: steps, LLM calls per role, and a
rough cost at list prices. Shown before a new run on a real endpoint, so an
absurd or expensive setting is seen before it is paid for.

The call counts are upper bounds of the patch mode (every gate evaluation
sent, none served from the score cache or the call table); the token counts
are guesses from text lengths (about four characters a token) and typical
reply sizes, so the cost is an order of magnitude, not a quote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from skillstate.config import SkillConfig
from skillstate.log.reducer import need
from skillstate.pricing import cost_usd, price_for
from skillstate.skillopt.final_selection import selection_split
from skillstate.skillopt.scheduler import steps_per_epoch
from skillstate.storage.store import Store

CHARS_PER_TOKEN = 4
TARGET_REPLY_TOKENS = 64
OPTIMIZER_REPLY_TOKENS = 800
OPTIMIZER_PROMPT_OVERHEAD = 600  # instructions and JSON shape of an optimizer prompt, in tokens


@dataclass(frozen=True)
class RunPlan:
    steps: int
    calls: dict[str, int]  # role -> calls, at most
    cost_usd: float  # rough, at list prices; 0 when no price is known
    unpriced: list[str]
    max_calls: int | None = None  # the config's budget for the steps, which may end them sooner

    def describe(self) -> str:
        calls = ", ".join(f"{n:,} {role}" for role, n in self.calls.items())
        cost = f"about ${self.cost_usd:,.2f} at list prices" if not self.unpriced else (
            f"cost unknown (no price for {', '.join(self.unpriced)})")
        budget = f"; max_calls {self.max_calls:,} ends the steps sooner if reached" if self.max_calls else ""
        return f"plan: {self.steps:,} steps, at most {calls} LLM calls, {cost}{budget}"


def _tokens(text_chars: float) -> int:
    return int(text_chars / CHARS_PER_TOKEN) + 1


def _merge_calls(patches: int, fan_in: int) -> int:
    """Calls of a merge tree over `patches` with `fan_in` patches per call."""
    calls, n = 0, patches
    while n > 1:
        groups = math.ceil(n / fan_in)
        calls, n = calls + groups, groups
    return calls


TURN_OBSERVATION_TOKENS = 120  # a text world's observation, or a tool's output, in tokens


def plan_run(config: SkillConfig, splits: dict[str, list[dict[str, Any]]], skill: str,
             multi_turn: bool = False, judge: bool = False) -> RunPlan:
    """With `multi_turn` every rollout counts as `episode.max_turns` target
    calls, each prompt holding the recent turns; with `judge` (env evals)
    each output is graded by `judge.samples` judge calls."""
    items = [i for rows in splits.values() for i in rows]
    item_chars = sum(len(str(i.get("question", i.get("prompt", "")))) + len(str(i.get("context") or ""))
                     for i in items) / max(len(items), 1)
    n_val, n_test = len(splits[config.val_split]), len(splits[config.test_split])
    steps = steps_per_epoch(len(splits[config.train_split]), config.batch_size, config.accumulation) * config.num_epochs
    batch = config.batch_size * config.accumulation
    sides = 1 if config.failure_only else 2
    patches = math.ceil(batch / config.minibatch_size) + sides - 1
    per_step_opt = patches + sides * _merge_calls(math.ceil(patches / sides), config.merge_batch_size) + 2
    tested = 2 + (judge and config.eval_without_skill)  # the initial and best skills (and env evals: no skill)
    target = n_val + (tested * n_test if config.eval_test else 0) + steps * (batch + n_val)
    optimizer = steps * per_step_opt
    epochs_with_boundary = max(config.num_epochs - 1, 0)
    if config.use_slow_update:
        target += epochs_with_boundary * 2 * config.slow_update_samples
        optimizer += epochs_with_boundary
    if config.use_meta_skill:
        optimizer += epochs_with_boundary
    if config.final_selection.enabled:  # at most `top` skills re-scored on the selection split
        target += config.final_selection.top * len(splits.get(selection_split(config.final_selection), []))
    target_prompt = _tokens(len(skill) + item_chars) + 20
    if multi_turn:
        target *= config.episode.max_turns
        target_prompt += (config.episode.history + 2) * TURN_OBSERVATION_TOKENS
    optimizer_prompt = OPTIMIZER_PROMPT_OVERHEAD + _tokens(len(skill) + config.minibatch_size * (item_chars + 400))
    calls = {"target": target, "optimizer": optimizer}
    if judge:  # env evals: each output graded by judge.samples calls, holding the task and the output
        calls["judge"] = target * config.judge.samples
    models = {role: config.model_for(role) for role in calls}
    prices = {role: price_for(model, config.prices) for role, model in models.items()}
    cost = cost_usd(target * target_prompt, target * min(TARGET_REPLY_TOKENS, config.target.max_tokens),
                    prices["target"])
    cost += cost_usd(optimizer * optimizer_prompt,
                     optimizer * min(OPTIMIZER_REPLY_TOKENS, config.optimizer.max_tokens), prices["optimizer"])
    if judge:
        judge_prompt = target_prompt + _tokens(item_chars) + 2 * TARGET_REPLY_TOKENS
        cost += cost_usd(calls["judge"] * judge_prompt,
                         calls["judge"] * min(2 * TARGET_REPLY_TOKENS, config.judge.max_tokens), prices["judge"])
    unpriced = sorted({models[r] for r, p in prices.items() if p is None})
    return RunPlan(steps, calls, round(cost, 4), unpriced, config.max_calls)


def plan_of(store: Store, run_id: str) -> RunPlan:
    """The plan of a run already created, from its log (its dataset snapshot and initial skill)."""
    from skillstate.engine.runner import config_of, env_of, load_run
    from skillstate.envs.episode import EpisodeEnv
    from skillstate.envs.tools import ToolEnv

    state = load_run(store, run_id).state
    env = env_of(store, state)
    from skillstate.reading.skill_text import skill_text

    config = config_of(state)
    judge = bool(getattr(env, "uses_judge", False))
    return plan_run(config, env.splits, skill_text(store, need(state.initial_skill, "the initial skill")),
                    multi_turn=isinstance(env, (EpisodeEnv, ToolEnv)) or state.config.get("disclosure") == "tools",
                    judge=judge)
