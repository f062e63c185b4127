"""One rollout of an item with a skill, wherever it runs (on the run context's threads, or on a Ray
environment actor): the environment plays it against a target call, and what it returns is checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skillstate.envs.base import JudgeCall, RolloutOutcome, SkillEnv, check_outcome
from skillstate.errors import EnvFailure
from skillstate.llm.base import CallResult
from skillstate.util import first_line

# One target call of a rollout: (messages, tools) -> its result.
TargetCall = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], CallResult]


def run_rollout(env: SkillEnv, env_name: str, skill: str, item: dict[str, Any], prompts: dict[str, str],
                target: TargetCall, judge: JudgeCall | None = None) -> RolloutOutcome:
    """One rollout, wherever it runs. An error raised by a target or judge
    call (an LLM stop) passes through; anything else the environment raises,
    or an outcome `check_outcome` refuses, becomes an EnvFailure naming the
    item. An environment that `uses_judge` is handed `judge`."""
    raised: list[BaseException] = []

    def noted(call: Callable[..., CallResult]) -> Callable[..., CallResult]:
        """`call`, with what it raises noted, so that an LLM stop passes through as itself."""
        def wrapped(*args: Any, **kwargs: Any) -> CallResult:
            try:
                return call(*args, **kwargs)
            except BaseException as err:
                raised.append(err)
                raise
        return wrapped

    try:
        if getattr(env, "uses_judge", False):
            grade = noted(judge) if judge else None
            outcome = env.rollout(skill, item, noted(target), prompts, judge=grade)  # type: ignore[call-arg]
        else:
            outcome = env.rollout(skill, item, noted(target), prompts)
    except Exception as err:
        if raised and err is raised[-1]:
            raise
        raise EnvFailure(f"env {env_name!r} failed on item {item['id']!r}: {type(err).__name__}: "
                         f"{first_line(err, '')}") from err
    return check_outcome(outcome, env_name, item["id"])  # scores finite in [0, 1], the documented types
