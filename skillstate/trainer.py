"""The Python API: a config object plus a trainer with `.train()`.

    from skillstate import SkillConfig, Trainer
    result = Trainer(SkillConfig(num_epochs=2), db="sqlite:///skillstate.db").train()
    print(result.best_score, result.best_skill)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from skillstate.config import SkillConfig
from skillstate.config_views import public_config, semantic_view, stored_config
from skillstate.engine.context import ProgressCallback
from skillstate.engine.runner import (
    BackendFactory,
    check_backend_factory,
    continue_run,
    create_run,
    evals_env,
    fork_run,
    load_run,
)
from skillstate.envs.registry import env_settings, resolve_env
from skillstate.errors import UserError
from skillstate.log.reducer import RunState, need
from skillstate.reading.history import run_summary
from skillstate.reading.skill_text import skill_text
from skillstate.storage.store import Store, open_store


@dataclass
class RunResult:
    run_id: str
    state: RunState
    store: Store

    @property
    def best_score(self) -> float | None:
        return self.state.best_score

    @property
    def baseline_score(self) -> float | None:
        return self.state.baseline.gate if self.state.baseline else None

    @property
    def best_skill(self) -> str:
        return skill_text(self.store, need(self.state.best_skill, "the best skill"))

    @property
    def current_skill(self) -> str:
        return skill_text(self.store, need(self.state.current_skill, "the current skill"))

    @cached_property
    def summary(self) -> dict[str, Any]:
        return run_summary(self.store, load_run(self.store, self.run_id))


def check_resumable(state: RunState, config: SkillConfig, run_id: str) -> None:
    """A resumed run must keep every setting that affects what it computes."""
    # the stored config is read back through the model, so keys added since it was written take their defaults
    stored = semantic_view(public_config(stored_config(dict(state.config))))
    config = evals_env(config)
    settings = env_settings(resolve_env(config.env), config.env_config, config.env)  # stored with its defaults
    given = semantic_view(public_config(config.model_copy(update={"env_config": settings.model_dump(mode="json")})))
    for key in sorted(set(stored) | set(given)):
        if stored.get(key) != given.get(key):
            raise UserError(
                f"run {run_id!r} was started with {key}={stored.get(key)!r}, not {given.get(key)!r}; "
                f"resume it unchanged, or fork it: skillstate fork {run_id} step_N --set {key}=..."
            )


class Trainer:
    """Runs SkillOpt for one run id, creating or resuming it."""

    def __init__(self, config: SkillConfig | None = None, *, db: str | None = None, store: Store | None = None,
                 run_id: str | None = None, on_progress: ProgressCallback | None = None,
                 backend_factory: BackendFactory | None = None):
        self.store = store or open_store(db)
        self.config = config
        self.run_id = run_id
        self.on_progress = on_progress
        self.backend_factory = backend_factory

    def prepare(self) -> str:
        """Create the run (or check that the existing one may be resumed); returns its id."""
        if self.run_id is not None and self.store.get_run(self.run_id) is not None:
            if self.config is not None:
                check_resumable(load_run(self.store, self.run_id).state, self.config, self.run_id)
            return self.run_id
        if self.config is not None:
            self.config = evals_env(self.config)  # a skill directory with evals and no data: env evals
        check_backend_factory(self.config or SkillConfig(), self.backend_factory)  # before the run exists
        self.run_id = create_run(self.store, self.config or SkillConfig(), self.run_id)
        return self.run_id

    def train(self) -> RunResult:
        run_id = self.prepare()
        state = continue_run(self.store, run_id, runtime=self.config, on_progress=self.on_progress,
                             backend_factory=self.backend_factory)
        return RunResult(run_id, state, self.store)

    def fork(self, step: int, overrides: dict[str, Any] | None = None, new_run_id: str | None = None) -> Trainer:
        """A trainer for a new run that continues this run's state after `step`."""
        if self.run_id is None:
            raise UserError("nothing to fork: this trainer has no run yet")
        child = fork_run(self.store, self.run_id, step, overrides or {}, new_run_id)
        return Trainer(store=self.store, run_id=child, on_progress=self.on_progress,
                       backend_factory=self.backend_factory)


def evaluate_skill(config: SkillConfig, split: str = "test", *, db: str | None = None, store: Store | None = None,
                   run_id: str | None = None, on_progress: ProgressCallback | None = None,
                   backend_factory: BackendFactory | None = None, without_skill: bool = False) -> RunResult:
    """Score `config.initial_skill` (a skill file; default: the environment's
    skill) on a split, recorded as an evaluation run in the log. With
    `without_skill`, score the target with no skill (a skill directory named
    by `initial_skill` still gives its evals).

    `split` is `train`, `val` or `test` (the config's names for them), or
    one of those configured split names itself."""
    if config.initial_skill is None and not without_skill:
        raise UserError("evaluation needs a skill file: pass --skill FILE")
    roles = {"train": config.train_split, "val": config.val_split, "test": config.test_split}
    name = roles.get(split, split)
    if name not in roles.values():
        raise UserError(f"unknown split {split!r}: use train, val or test")
    config = evals_env(config)
    check_backend_factory(config, backend_factory)
    store = store or open_store(db)
    rid = create_run(store, config, run_id, eval_split=name, without_skill=without_skill)
    state = continue_run(store, rid, runtime=config, on_progress=on_progress, backend_factory=backend_factory)
    return RunResult(rid, state, store)
