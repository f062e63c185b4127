"""Driving a run: pick the next stage from the folded state, run it, append
its events, fold them, repeat. Also creating, loading and forking runs."""

from __future__ import annotations

import datetime as dt
import json
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy.exc import SQLAlchemyError

from skillstate import __version__
from skillstate.config import RUNTIME_KEYS, SkillConfig, merge_overrides, public_config, redact, validate_config
from skillstate.engine import epoch, reflect, stages, update
from skillstate.engine.context import ProgressCallback, RunContext, RunLog, StoreLog
from skillstate.envs import QAEnv, load_dataset_dir
from skillstate.envs.base import SkillEnv
from skillstate.chain import check_chain
from skillstate.errors import (
    BudgetStop, ConfigError, CorruptLogError, DataError, LLMStop, NotFoundError, StorageStop, UserError,
)
from skillstate.events import Event, GateDecided, BaselineEvaluated, RunForked, RunStarted
from skillstate.lease import RunLease
from skillstate.llm.base import CircuitOpen, FatalLLMError, LLMClient
from skillstate.llm.health import CallHealth
from skillstate.llm.recording import RecordingClient
from skillstate.pricing import Budget, BudgetExhausted, price_for, sent_cost
from skillstate.prompts import PROMPT_NAMES, resolve_prompts
from skillstate.reducer import RunState, fold, reduce
from skillstate.scheduler import steps_per_epoch
from skillstate.store import GENESIS, StoredEvent, Store
from skillstate.util import canonical_json, hash_value, sha256_text

Stage = Callable[[RunContext, RunState], list[Event]]

STAGES: dict[str, Stage] = {
    "baseline": stages.baseline,
    "start_step": stages.start_step,
    "rollout": stages.rollout,
    "reflect": reflect.reflect,
    "aggregate": reflect.aggregate,
    "learning_rate": update.choose_learning_rate,
    "select": update.select,
    "update": update.update,
    "evaluate": stages.evaluate_candidate,
    "gate": stages.decide,
    "epoch_compare": epoch.compare_epochs,
    "slow_update": epoch.slow_update,
    "slow_update_decide": epoch.slow_update_decide,
    "meta_skill": epoch.meta_skill,
    "end_epoch": epoch.end_epoch,
    "final_validate": epoch.final_validate,
    "test_baseline": stages.test_eval("baseline"),
    "test_best": stages.test_eval("best"),
    "eval_skill": stages.eval_skill,
    "complete": stages.complete,
}


def next_stage(ctx: RunContext, state: RunState) -> str | None:
    """The stage that comes next after `state`, or None when the run is done."""
    cfg = ctx.config
    if state.kind == "eval":
        if "eval" not in state.tests:
            return "eval_skill"
        return None if state.completed else "complete"
    if state.baseline is None:
        return "baseline"
    p = state.progress
    if p is None:
        if state.boundary is not None or epoch.boundary_epoch(cfg, state) is not None:
            return epoch.boundary_stage(cfg, state)
        if state.last_completed_step < state.total_steps:
            return "start_step"
        if cfg.use_slow_update and not state.final_validated:
            return "final_validate"
        if cfg.eval_test and "baseline" not in state.tests:
            return "test_baseline"
        if cfg.eval_test and "best" not in state.tests:
            return "test_best"
        return None if state.completed else "complete"
    if p.rollout is None:
        return "rollout"
    if reflect.pending_minibatches(ctx, state):
        return "reflect"
    if p.merged is None:
        return "aggregate"
    if stages.skip_reason(state, cfg.update_mode):
        return "gate"
    if cfg.update_mode != "full_rewrite":  # full_rewrite has no budget: no learning rate, no select
        if cfg.lr_control == "autonomous" and p.learning_rate is None:
            return "learning_rate"
        if p.selected is None:
            return "select"
    if p.candidate is None:
        return "update"
    if p.evaluation is None:
        return "evaluate"
    return "gate"


def drive(ctx: RunContext, state: RunState, before_stage: Callable[[str], None] | None = None) -> RunState:
    """Run stages until the run is complete. A stage whose calls failed too
    often (the circuit breaker) raises before its events are appended."""
    while (name := next_stage(ctx, state)) is not None:
        if before_stage is not None:
            before_stage(name)
        ctx.report("stage", name, state)
        ctx.health.begin_stage(name)
        events = STAGES[name](ctx, state)
        ctx.health.end_stage()
        stored = ctx.log.append(events, ctx.take_blobs())
        for i, event in enumerate(events):
            state = reduce(state, event)
            ctx.report("event", name, state, event, stored[i] if i < len(stored) else None)
    return state


# --- loading -----------------------------------------------------------------


def new_run_id(prefix: str = "run") -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}-{stamp}-{secrets.token_hex(2)}"


def lineage_events(store: Store, run_id: str) -> list[StoredEvent]:
    """The events that make up a run: its fork parent's prefix, then its own."""
    own = store.read_events(run_id)
    run = store.get_run(run_id)
    if run is None or run.parent_run_id is None or not own:
        return own
    first = own[0].event
    if not isinstance(first, RunForked):
        raise CorruptLogError(f"run {run_id!r} has a parent but does not start with RunForked")
    return lineage_events(store, run.parent_run_id)[: first.parent_event_count] + own


def lineage_run_ids(store: Store, run_id: str) -> list[str]:
    ids = []
    current: str | None = run_id
    while current is not None:
        ids.append(current)
        row = store.get_run(current)
        current = row.parent_run_id if row else None
    return ids


def step_boundary(stored: list[StoredEvent], step: int) -> int:
    """Number of events up to the end of `step` (0 = the baseline)."""
    for i, s in enumerate(stored):
        if step == 0 and s.type == BaselineEvaluated.type:
            return i + 1
        if step > 0 and s.type == GateDecided.type and s.step == step:
            return i + 1
    last = max((s.step for s in stored if s.type == GateDecided.type), default=None)
    if last is None and not any(s.type == BaselineEvaluated.type for s in stored):
        raise NotFoundError(f"step {step} is beyond the end of the run (no baseline yet)")
    raise NotFoundError(f"step {step} is beyond the end of the run (last completed step: {last or 0})")


def state_of(stored: list[StoredEvent]) -> RunState:
    return fold(s.event for s in stored)


def config_of(state: RunState) -> SkillConfig:
    return validate_config(dict(state.config))


# Environment kinds by the config key `env`.
ENVIRONMENTS: dict[str, type[SkillEnv]] = {"qa": QAEnv}


def env_of(store: Store, state: RunState) -> SkillEnv:
    """The run's environment, on the dataset snapshot stored in its log."""
    splits = {name: json.loads(store.get_blob(info["hash"])) for name, info in state.dataset.items()}
    return ENVIRONMENTS[state.config.get("env", "qa")](splits)


def make_backend(config: SkillConfig, env: SkillEnv, role: str) -> LLMClient:
    if config.backend == "sim":
        from skillstate.sim.backend import SimBackend
        from skillstate.sim.world import SimWorld

        return SimBackend(SimWorld([item for items in env.splits.values() for item in items]))
    from skillstate.llm.openai_backend import OpenAIBackend

    return OpenAIBackend(getattr(config, role), role)


BackendFactory = Callable[[SkillConfig, SkillEnv, str], LLMClient]


def build_context(store: Store, run_id: str, state: RunState, config: SkillConfig, log: RunLog, *,
                  on_progress: ProgressCallback | None = None, verify_until=None,
                  backend_factory: BackendFactory | None = None) -> RunContext:
    """The context a run executes in. With `verify_until` (a timestamp) there
    is no backend: LLM responses come only from calls recorded until then."""
    env = env_of(store, state)
    prompts = {name: store.get_blob(h) for name, h in state.prompts.items()}
    scope = None if config.llm_cache == "all" else lineage_run_ids(store, run_id)
    factory = backend_factory or make_backend
    verifying = verify_until is not None
    budget = None if verifying else run_budget(store, run_id, config)
    health = CallHealth(0, 1.0) if verifying else CallHealth(config.max_consecutive_failures,
                                                              config.max_stage_failure_share)
    clients = {}
    for role in roles_of(state.kind):
        config.model_for(role)  # a missing model is a user error before anything runs
        backend = None if verifying else factory(config, env, role)
        clients[role] = RecordingClient(backend, store, run_id=run_id, role=role, run_ids=scope,
                                        before=verify_until, budget=budget, health=health)
    ctx = RunContext(store=store, run_id=run_id, config=config, env=env, prompts=prompts, clients=clients,
                     log=log, on_progress=on_progress, health=health)
    models: dict[str, list[str]] = {}  # one warning per model, whatever roles share it
    for role in roles_of(state.kind):
        models.setdefault(config.model_for(role), []).append(role)
    for model, roles in models.items():
        if verify_until is None and price_for(model, config.prices) is None:
            ctx.warn(f"no price for model {model!r} ({' and '.join(roles)}): its calls count as $0; "
                     f"add it with --set 'prices={{\"{model}\": [IN, OUT]}}' (USD per 1M tokens)")
    return ctx


def run_budget(store: Store, run_id: str, config: SkillConfig) -> Budget:
    """The run's cost budget, starting from what its requests so far cost."""
    spent = sum(sent_cost(store.paid_by_model(run_id), config.prices).values())
    return Budget(config.max_cost_usd, spent, config.prices)


# --- creating runs -------------------------------------------------------------


def _dataset(config: SkillConfig) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
    """The splits and the default skill of the run's environment."""
    wanted = [config.train_split, config.val_split, config.test_split]
    if config.data:
        return load_dataset_dir(config.data, wanted), None
    if config.backend != "sim":
        raise DataError("backend openai needs a dataset: pass --data DIR (with train/val/test .jsonl)")
    from skillstate.sim.world import bundled_skill, bundled_splits

    generated = bundled_splits()
    return {name: generated[default] for name, default in zip(wanted, ("train", "val", "test"))}, bundled_skill()


def _initial_skill(config: SkillConfig, default: str | None) -> str:
    if config.initial_skill:
        from pathlib import Path

        try:
            return Path(config.initial_skill).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"cannot read initial skill {config.initial_skill}: "
                              f"{getattr(err, 'strerror', None) or err}") from None
    return default if default is not None else QAEnv({}).default_skill()


def roles_of(kind: str) -> tuple[str, ...]:
    """The LLM roles a run of this kind calls: an evaluation run only has a target."""
    return ("target",) if kind == "eval" else ("target", "optimizer")


# More steps than this is a mistake, not a plan (SkillOpt's own runs have tens).
MAX_TOTAL_STEPS = 100_000


def check_schedule(total_steps: int) -> None:
    if total_steps > MAX_TOTAL_STEPS:
        raise ConfigError(f"the schedule has {total_steps:,} steps, more than the {MAX_TOTAL_STEPS:,} allowed; "
                          "lower num_epochs or raise batch_size")


def preflight(config: SkillConfig, roles: tuple[str, ...] = ("target", "optimizer"), *,
              probe: bool = True) -> None:
    """Fail on missing models or credentials before anything is written; with
    `probe`, also ask each endpoint whether it answers and serves the model,
    so a bad key, a closed port or an unknown model leaves no run behind."""
    checked: set[tuple[Any, ...]] = set()
    for role in roles:
        model = config.model_for(role)
        if config.backend != "openai":
            continue
        from skillstate.llm.openai_backend import OpenAIBackend

        cfg = getattr(config, role)
        backend = OpenAIBackend(cfg, role)
        key = (cfg.base_url, cfg.api_key_env, cfg.azure, model)
        if probe and key not in checked:
            checked.add(key)
            try:
                backend.check(model)
            except FatalLLMError as err:
                raise UserError(f"{err}; no run was created") from None


def create_run(store: Store, config: SkillConfig, run_id: str | None = None, *,
               eval_split: str | None = None) -> str:
    """Validate everything, then write the run row and RunStarted atomically.

    With `eval_split` the run is an evaluation run: it scores its initial
    skill on that split and has no steps."""
    run_id = run_id or new_run_id("eval" if eval_split else "run")
    if store.get_run(run_id) is not None:
        raise UserError(f"run {run_id!r} already exists")
    preflight(config, roles_of("eval" if eval_split else "train"), probe=False)
    splits, default_skill = _dataset(config)
    if eval_split is not None and eval_split not in splits:
        raise ConfigError(f"unknown split {eval_split!r} (this run's splits: {', '.join(splits)})")
    skill = _initial_skill(config, default_skill)
    prompts = resolve_prompts(config.prompts)
    blobs: dict[str, str] = {}

    def put(text: str) -> str:
        h = sha256_text(text)
        blobs[h] = text
        return h

    dataset = {name: {"hash": put(canonical_json(items)), "count": len(items)} for name, items in splits.items()}
    spe = steps_per_epoch(len(splits[config.train_split]), config.batch_size, config.accumulation)
    if not eval_split:
        check_schedule(spe * config.num_epochs)
    preflight(config, roles_of("eval" if eval_split else "train"))  # last: it may call the endpoints
    event = RunStarted(
        config=public_config(config), initial_skill=put(skill), dataset=dataset,
        dataset_fingerprint=hash_value({k: v["hash"] for k, v in dataset.items()}),
        prompts={name: put(text) for name, text in prompts.items()},
        steps_per_epoch=0 if eval_split else spe, total_steps=0 if eval_split else spe * config.num_epochs,
        package_version=__version__, kind="eval" if eval_split else "train", eval_split=eval_split,
    )
    store.append(run_id, [event], last_seq=0, last_hash=GENESIS, blobs_to_put=blobs, new_run={})
    return run_id


# Keys a fork may not change: they define what the inherited state means.
FIXED_ON_FORK = ("env", "data", "train_split", "val_split", "test_split", "initial_skill")


def fork_run(store: Store, parent_run_id: str, step: int, overrides: dict[str, Any],
             run_id: str | None = None, *, probe: bool = True) -> str:
    """A new run inheriting the parent's state after `step`, with overrides.
    Without `probe` the endpoints are not asked (a fork created offline, to
    be trained later)."""
    parent = lineage_events(store, parent_run_id)
    if parent and getattr(parent[0].event, "kind", "train") != "train":
        raise UserError(f"run {parent_run_id!r} is an evaluation run; only training runs can be forked")
    count = step_boundary(parent, step)
    state = state_of(parent[:count])
    for key in overrides:
        if key.split(".")[0] in FIXED_ON_FORK:
            raise ConfigError(f"a fork cannot change {key}: it inherits the parent's data and starting skill")
    config = validate_config(merge_overrides(dict(state.config), overrides))
    prompts = dict(state.prompts)
    blobs: dict[str, str] = {}
    inherited = dict(state.config.get("prompts", {}))
    # overridden prompts, and prompts this skillstate has that the parent's version did not
    changed = {k: v for k, v in config.prompts.items() if inherited.get(k) != v}
    missing = [name for name in PROMPT_NAMES if name not in prompts and name not in changed]
    if changed or missing:
        texts = resolve_prompts(changed)
        for name in [*changed, *missing]:
            h = sha256_text(texts[name])
            prompts[name], blobs[h] = h, texts[name]
    spe = steps_per_epoch(state.dataset[config.train_split]["count"], config.batch_size, config.accumulation)
    total = spe * config.num_epochs
    if total < step:
        raise ConfigError(f"the fork's schedule has {total} steps, fewer than the fork step {step}")
    check_schedule(total)
    run_id = run_id or new_run_id("fork")
    if store.get_run(run_id) is not None:
        raise UserError(f"run {run_id!r} already exists")
    preflight(config, probe=probe)
    event = RunForked(parent_run_id=parent_run_id, fork_step=step, parent_event_count=count,
                      parent_event_hash=parent[count - 1].hash,
                      overrides={k: redact(v) if isinstance(v, str) else v for k, v in overrides.items()},
                      config=public_config(config), prompts=prompts, steps_per_epoch=spe, total_steps=total)
    store.append(run_id, [event], last_seq=0, last_hash=parent[count - 1].hash, blobs_to_put=blobs,
                 new_run={"parent_run_id": parent_run_id, "fork_step": step})
    return run_id


@dataclass
class LoadedRun:
    run_id: str
    lineage: list[StoredEvent]
    own: list[StoredEvent]
    state: RunState

    def state_at(self, step: int) -> RunState:
        """The state after `step` (0 = after the baseline), folded from the log."""
        return state_of(self.lineage[: step_boundary(self.lineage, step)])

    @property
    def log_position(self) -> tuple[int, str]:
        last = self.own[-1] if self.own else None
        return (last.seq, last.hash) if last else (0, GENESIS)


def load_run(store: Store, run_id: str | None) -> LoadedRun:
    """A run's lineage, checked (sequence, hash chain, signatures, readable
    payloads) and folded. A damaged log raises CorruptLogError: nothing is
    resumed, replayed or verified on top of it."""
    row = store.require_run(run_id)
    try:
        lineage = lineage_events(store, row.run_id)
    except CorruptLogError:
        raise
    except Exception as err:  # an unreadable RunForked
        raise CorruptLogError(f"run {row.run_id}: the fork's first event cannot be read: {err}") from None
    _, problem = check_chain(lineage, key=store.audit_key)
    if problem:
        raise CorruptLogError(f"{problem}; the log of run {row.run_id} is damaged and nothing was done")
    own = [s for s in lineage if s.run_id == row.run_id]
    try:
        state = state_of(lineage)
    except Exception as err:
        raise CorruptLogError(f"run {row.run_id}: the log cannot be folded: {err}") from None
    return LoadedRun(row.run_id, lineage, own, state)


def with_runtime(stored: SkillConfig, runtime: SkillConfig) -> SkillConfig:
    """The stored config with the runtime-only keys (endpoint, retries,
    concurrency) taken from `runtime`: they may change on resume."""
    data = stored.model_dump()
    fresh = runtime.model_dump()
    for key in RUNTIME_KEYS:
        if "." in key:
            role, name = key.split(".")
            data[role][name] = fresh[role][name]
        else:
            data[key] = fresh[key]
    return validate_config(data)


def continue_run(store: Store, run_id: str, *, runtime: SkillConfig | None = None,
                 on_progress: ProgressCallback | None = None,
                 backend_factory: BackendFactory | None = None) -> RunState:
    """Run (or resume) `run_id` until it completes."""
    with RunLease(store, run_id) as lease:  # before anything is read to act on: one driver per run
        loaded = load_run(store, run_id)
        config = config_of(loaded.state)
        if runtime is not None:
            config = with_runtime(config, runtime)
        seq, last_hash = loaded.log_position
        ctx = build_context(store, run_id, loaded.state, config, StoreLog(store, run_id, seq, last_hash, lease),
                            on_progress=on_progress, backend_factory=backend_factory)
        try:
            return drive(ctx, loaded.state)
        except FatalLLMError as err:
            raise LLMStop(str(err), run_id, fatal=True) from None
        except CircuitOpen as err:
            raise LLMStop(f"stopped: {err}", run_id) from None
        except BudgetExhausted as err:
            raise BudgetStop(str(err), run_id) from None
        except SQLAlchemyError as err:
            reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
            raise StorageStop(f"database error: {redact(reason)}", run_id) from None
        finally:
            ctx.close()
