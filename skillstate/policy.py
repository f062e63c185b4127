"""Training the policy's weights from a run (the library behind `skillstate
sft` and `skillstate grpo`): SkillRL's phases 3 and 4 with TRL.

- `sft`: TRL's SFTTrainer on the run's skill-augmented demonstrations (the
  rows `export-sft` writes; with `policy.with_imported`, its imported
  trajectories too).
- `grpo`: TRL's GRPOTrainer on the run's environment (a question-answering
  kind: one reply, scored by the environment), each prompt with the skills
  the bank retrieves for it, the reward the environment's scorer; with
  `policy.evolve`, the bank evolves during training (SkillRL's Algorithm 1).

A policy training is a run of its own kind in the same log: its config is
the source run's (environment, data, bank, teacher) with the `policy`
settings, its skill the source run's best skill or bank, and its events
record the base model's identity, the data's hash, the trainer's settings,
every metric and checkpoint, each validation and evolution. The same
command with the same run id, or `skillstate resume`, continues from the
last checkpoint."""

from __future__ import annotations

from typing import Any

from skillstate.config import SkillConfig
from skillstate.config_sources import merge_overrides
from skillstate.config_views import stored_config, validate_config
from skillstate.engine.context import ProgressCallback
from skillstate.engine.create import FIXED_ON_FORK, PolicyStart
from skillstate.engine.loading import load_run, new_run_id
from skillstate.engine.policy_model import (
    check_base_model,
    check_output_dir,
    library_versions,
    model_identity,
    require_training_libraries,
)
from skillstate.engine.runner import continue_run, create_run
from skillstate.envs import QAEnv
from skillstate.envs.registry import resolve_env
from skillstate.errors import ConfigError, UserError
from skillstate.log.events_policy import PolicyStarted
from skillstate.storage.store import Store
from skillstate.trainer import RunResult
from skillstate.util import sha256_text

METHODS = ("sft", "grpo")


def _config(store: Store, source_run: str, method: str, base_model: str, overrides: dict[str, Any]) -> SkillConfig:
    """The source run's config, as its log holds it, with the policy settings and the overrides."""
    loaded = load_run(store, source_run)
    if loaded.state.kind != "train":
        raise UserError(f"run {source_run!r} is {'an evaluation' if loaded.state.kind == 'eval' else 'a policy'} "
                        "run: train the policy from a training run (its rollouts, its bank)")
    data = stored_config(dict(loaded.state.config)).model_dump(mode="json")
    data["bank"]["trajectories"] = None  # already in the log (and, with policy.with_imported, in the SFT rows)
    data["policy"] = {**data.get("policy", {}), "method": method, "base_model": base_model}
    return validate_config(merge_overrides(data, overrides))


def _check(config: SkillConfig, method: str) -> None:
    pc = config.policy
    if method == "grpo":
        env_cls = resolve_env(config.env)
        if not issubclass(env_cls, QAEnv):
            raise ConfigError(f"grpo trains on one-reply environments (qa and its kind), and env {config.env!r} "
                              "plays episodes: train its policy with sft, or export its episode groups with "
                              "export-grpo")
        if (pc.batch_size * pc.gradient_accumulation_steps) % pc.num_generations:
            raise ConfigError(f"policy.batch_size x gradient_accumulation_steps ({pc.batch_size} x "
                              f"{pc.gradient_accumulation_steps}) must be a multiple of policy.num_generations "
                              f"({pc.num_generations}): each prompt's group of completions is trained together")


def _sft_rows(store: Store, source_run: str, with_imported: bool) -> list[dict[str, Any]]:
    from skillstate.exports.imported_sft import imported_sft_rows
    from skillstate.exports.training_data import sft_rows

    rows, _skipped = sft_rows(store, source_run)
    if with_imported:
        rows = imported_sft_rows(store, source_run) + rows
    if not rows:
        raise UserError(f"run {source_run!r} has no successful demonstration to train on (export-sft finds none)")
    return rows


class PolicyTrainer:
    """Creates a policy training run from `source_run` and trains it; with the `run_id` of an existing one,
    continues it from its last checkpoint (as `skillstate resume` does)."""

    def __init__(self, store: Store, method: str, *, source_run: str | None = None, base_model: str | None = None,
                 overrides: dict[str, Any] | None = None, run_id: str | None = None,
                 on_progress: ProgressCallback | None = None):
        if method not in METHODS:
            raise UserError(f"unknown method {method!r}: sft or grpo")
        self.store, self.method, self.source_run, self.base_model = store, method, source_run, base_model
        self.overrides, self.run_id, self.on_progress = overrides or {}, run_id, on_progress

    def prepare(self) -> str:
        require_training_libraries()
        store, method = self.store, self.method
        if self.run_id is not None and store.get_run(self.run_id) is not None:
            state = load_run(store, self.run_id).state
            if state.kind != "policy" or state.policy is None or state.policy.started.method != method:
                raise UserError(f"run {self.run_id!r} exists and is not a {method} policy training: choose "
                                "another --run-id")
            if self.source_run is not None and self.source_run != state.policy.started.source_run:
                raise UserError(f"run {self.run_id!r} trains from run {state.policy.started.source_run!r}, not "
                                f"{self.source_run!r}")
            return self.run_id
        if self.source_run is None or self.base_model is None:
            raise UserError("a new policy training needs the run to learn from and the model to train (--model DIR)")
        self.run_id = create_policy_run(store, method, self.source_run, self.base_model, self.overrides,
                                        self.run_id)
        return self.run_id

    def train(self) -> RunResult:
        run_id = self.prepare()
        return RunResult(run_id, continue_run(self.store, run_id, on_progress=self.on_progress), self.store)


def create_policy_run(store: Store, method: str, source_run: str, base_model: str, overrides: dict[str, Any],
                      run_id: str | None = None) -> str:
    """The run, with RunStarted and PolicyStarted written together; nothing is written on bad input."""
    from pathlib import Path

    from skillstate.engine.policy_train import trainer_settings
    from skillstate.util import canonical_json

    fixed = [k for k in overrides if k in FIXED_ON_FORK or k.split(".")[0] in FIXED_ON_FORK]
    if fixed:
        raise UserError(f"{fixed[0]} is the source run's: a policy trains on that run's data and skills (set only "
                        "policy.*, the gate and runtime keys)")
    config = _config(store, source_run, method, base_model, overrides)
    _check(config, method)
    identity = model_identity(base_model)
    check_base_model(identity.path)
    run_id = run_id or new_run_id(method)
    output_dir = str(Path(config.policy.output_dir or f"policy/{run_id}").resolve())
    check_output_dir(output_dir)
    source = load_run(store, source_run).state
    skill = store.get_blob(source.best_skill or source.current_skill or "")
    blobs: dict[str, str] = {}
    dataset = None
    rows = 0
    if method == "sft":
        lines = _sft_rows(store, source_run, config.policy.with_imported)
        text = "".join(canonical_json(r) + "\n" for r in lines)
        dataset = sha256_text(text)
        blobs[dataset] = text
        rows = len(lines)
    started = PolicyStarted(method=method, base_model=identity, source_run=source_run, dataset=dataset,
                            dataset_sha256=dataset, dataset_rows=rows,
                            trainer_config=trainer_settings(config.policy, method, config.seed),
                            output_dir=output_dir, library_versions=library_versions())
    return create_run(store, config, run_id, policy=PolicyStart(skill=skill, events=[started], blobs=blobs))
