"""Where rollouts run (config key `executor`): `threads`, in this process on
the run context's worker threads, or `ray`, as Ray tasks on a pool of
environment actors (`skillstate.engine.ray_executor`). Either way the stages
see the same `RolloutOutcome`s and the driver journals every call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from skillstate.envs.base import RolloutOutcome, SkillEnv, check_outcome
from skillstate.errors import ConfigError, EnvFailure
from skillstate.llm.base import CallResult
from skillstate.util import first_line

if TYPE_CHECKING:
    from skillstate.engine.context import RunContext

# One target call of a rollout: (messages, tools) -> its result.
TargetCall = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], CallResult]


class Executor(Protocol):
    def rollout(self, ctx: RunContext, skill: str, item: dict[str, Any], sample: int | None) -> RolloutOutcome:
        """Roll `item` out with the skill text `skill` (as sample `sample`); raise EnvFailure when the
        environment fails, or the error that stopped one of its LLM calls."""
        ...

    def close(self) -> None: ...


class ThreadsExecutor:
    """Rollouts on the calling thread (the run context's pool bounds them)."""

    def rollout(self, ctx: RunContext, skill: str, item: dict[str, Any], sample: int | None) -> RolloutOutcome:
        def target(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult:
            return ctx.llm("target", messages, tools=tools, seed=sample)

        return run_rollout(ctx.env, ctx.config.env, skill, item, ctx.prompts, target)

    def close(self) -> None:
        pass


def run_rollout(env: SkillEnv, env_name: str, skill: str, item: dict[str, Any], prompts: dict[str, str],
                target: TargetCall) -> RolloutOutcome:
    """One rollout, wherever it runs. An error raised by a target call (an
    LLM stop) passes through; anything else the environment raises, or an
    outcome `check_outcome` refuses, becomes an EnvFailure naming the item."""
    raised: list[BaseException] = []

    def complete(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult:
        try:
            return target(messages, tools)
        except BaseException as err:
            raised.append(err)
            raise

    try:
        outcome = env.rollout(skill, item, complete, prompts)
    except Exception as err:
        if raised and err is raised[-1]:
            raise
        raise EnvFailure(f"env {env_name!r} failed on item {item['id']!r}: {type(err).__name__}: "
                         f"{first_line(err, '')}") from err
    return check_outcome(outcome, env_name, item["id"])  # scores finite in [0, 1], the documented types


def pool_size(concurrency: int, num_cpus: float, cluster_cpus: float) -> int:
    """How many environment actors: one per slot of the cap, as many as the cluster's CPUs can host."""
    if num_cpus <= 0:
        return concurrency
    return max(1, min(concurrency, int(cluster_cpus // num_cpus)))


def check_executor(config: Any, connect: bool = False) -> None:
    """A ConfigError when the executor the config (a SkillConfig) names cannot run here; with `connect`, Ray
    is also started or joined (a cluster that cannot be reached is refused before a run is written)."""
    if config.executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("executor ray needs Ray: pip install 'skillstate[ray]'") from None
        if connect:
            from skillstate.engine.ray_executor import connect as connect_ray

            connect_ray(config)


def make_executor(ctx: RunContext, splits: dict[str, list[dict[str, Any]]]) -> Executor:
    """The executor the run's config names (verification always re-executes on threads: it sends nothing)."""
    if ctx.config.executor == "threads" or ctx.verifying:
        return ThreadsExecutor()
    check_executor(ctx.config)
    from skillstate.engine.ray_executor import RayExecutor

    return RayExecutor(ctx, splits)
