"""Where rollouts run (config key `executor`): `threads`, in this process on
the run context's worker threads, or `ray`, as Ray tasks on a pool of
environment actors (`skillstate.engine.ray_executor`). Either way the stages
see the same `RolloutOutcome`s and the driver journals every call."""

from __future__ import annotations

from typing import Any

# The Executor protocol and the default ThreadsExecutor live in engine.context, which holds the run's
# executor; the implementations here depend on the context, never the other way round.
from skillstate.engine.context import Executor, RunContext, ThreadsExecutor
from skillstate.errors import ConfigError
from skillstate.util import install_hint


def pool_size(concurrency: int, num_cpus: float, cluster_cpus: float) -> int:
    """How many environment actors: one per slot of the cap, as many as the cluster's CPUs can host."""
    if num_cpus <= 0:
        return concurrency
    return max(1, min(concurrency, int(cluster_cpus // num_cpus)))


def check_executor(config: Any, connect: bool = False) -> None:
    """A ConfigError when the executor the config (a SkillConfig) names cannot run here; with `connect`, Ray
    is also started or joined (a cluster that cannot be reached is refused before a run is written)."""
    if config.executor == "ray":
        from skillstate.engine.loading import judged

        if judged(config.env):
            raise ConfigError(f"env {config.env!r} grades with a judge, which runs on the driver's threads: use "
                              "executor threads")
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError(f"executor ray needs Ray: {install_hint('ray')}") from None
        if connect:
            from skillstate.engine.ray_executor import connect as connect_ray

            connect_ray(config)


def make_executor(ctx: RunContext, splits: dict[str, list[dict[str, Any]]]) -> Executor:
    """The executor the run's config names (verification always re-executes on threads: it sends nothing; the
    rollouts of an external agent, which cannot be re-executed, it takes from the log and checks)."""
    if ctx.verifying and not getattr(ctx.env, "replays_agent", True):
        from skillstate.engine.recorded import RecordedExecutor

        return RecordedExecutor(ctx)
    if ctx.config.executor == "threads" or ctx.verifying:
        return ThreadsExecutor()
    check_executor(ctx.config)
    from skillstate.engine.ray_executor import RayExecutor

    return RayExecutor(ctx, splits)
