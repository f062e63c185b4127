"""Driving a run: pick the next stage from the folded state, run it, append
its events, fold them, repeat, under the run's lease and the failure policy.

Creating and forking runs live in `create`, reading them back in `loading`;
both are re-exported here, the engine's one entry point."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from skillstate.config import SkillConfig, redact
from skillstate.config_views import RUNTIME_KEYS, stored_config
from skillstate.engine import (
    ahead,
    bank,
    blockers,
    candidate_check,
    edit_screen,
    epoch,
    final_select,
    policy_stages,
    prune,
    reflect,
    repair,
    review,
    stages,
    update,
)
from skillstate.engine.context import ProgressCallback, RunContext, RunLog, StoreLog
from skillstate.engine.create import (  # noqa: F401  (re-exported)
    FIXED_ON_FORK,
    MAX_TOTAL_STEPS,
    check_schedule,
    create_run,
    evals_env,
    fork_run,
    preflight,
)
from skillstate.engine.executors import make_executor
from skillstate.engine.loading import (  # noqa: F401  (re-exported)
    LoadedRun,
    config_of,
    judged,
    lineage_events,
    lineage_run_ids,
    load_run,
    new_run_id,
    roles_of,
    state_of,
    step_boundary,
)
from skillstate.engine.stops import StopCheck, StopConditions, already_stopped
from skillstate.envs.base import SkillEnv
from skillstate.envs.registry import make_env
from skillstate.envs.run_paths import name_database, name_run_paths
from skillstate.errors import BudgetStop, ConfigError, EnvFailure, EnvStop, LLMStop, StorageStop
from skillstate.llm.base import CircuitOpen, FatalLLMError, LLMClient
from skillstate.llm.health import AheadHealth, CallHealth
from skillstate.llm.recording import RecordingClient
from skillstate.log.events import Event
from skillstate.log.reducer import RunState, reduce
from skillstate.pricing import Budget, BudgetExhausted, price_for, sent_cost
from skillstate.storage.call_index import REFRESH_SECONDS, CallIndex
from skillstate.storage.lease import RunLease
from skillstate.storage.store import Store

Stage = Callable[[RunContext, RunState], list[Event]]

STAGES: dict[str, Stage] = {
    "baseline": stages.baseline,
    "start_step": stages.start_step,
    "rollout": stages.rollout,
    "reflect": reflect.reflect,
    "aggregate": reflect.aggregate,
    "learning_rate": update.choose_learning_rate,
    "screen": edit_screen.try_edits,
    "check": candidate_check.check,
    "select": update.select,
    "update": update.update,
    "seed_bank": bank.seed_bank,
    "distill": bank.distill,
    "validate_bank": bank.validate_bank,
    "evolve": bank.evolve,
    "evaluate": stages.evaluate_candidate,
    "gate": review.gate,  # stages.decide, and the step's review request when it falls under `review`
    "repair": repair.ablate,
    "blocker_search": blockers.search,
    "epoch_compare": epoch.compare_epochs,
    "slow_update": epoch.slow_update,
    "slow_update_decide": epoch.slow_update_decide,
    "meta_skill": epoch.meta_skill,
    "end_epoch": epoch.end_epoch,
    "final_validate": epoch.final_validate,
    "prune_propose": prune.propose,
    "prune_decide": prune.decide,
    "final_score": final_select.score_candidate,
    "final_select": final_select.select_final,
    "test_baseline": stages.test_eval("baseline"),
    "test_best": stages.test_eval("best"),
    "test_no_skill": stages.test_eval("no_skill"),
    "eval_skill": stages.eval_skill,
    "policy_train": policy_stages.policy_train,
    "policy_validate": policy_stages.policy_validate,
    "policy_evolve": policy_stages.policy_evolve,
    "complete": stages.complete,
    **review.STAGES,  # await_review, review_rebuild, review_evaluate, review_close
}


def next_stage(ctx: RunContext, state: RunState) -> str | None:
    """The stage that comes next after `state`, or None when the run is done."""
    cfg = ctx.config
    if state.kind == "eval":
        if "eval" not in state.tests:
            return "eval_skill"
        return None if state.completed else "complete"
    if state.kind == "policy":
        return policy_stages.next_policy_stage(cfg, state)
    if state.baseline is None:
        return "seed_bank" if cfg.mode == "bank" and state.trajectories and not state.seeded else "baseline"
    p = state.progress
    if p is None:
        if state.boundary is not None or epoch.boundary_epoch(cfg, state) is not None:
            return epoch.boundary_stage(cfg, state)
        if prune.due(cfg, state):
            return prune.stage(state)
        if state.last_completed_step < state.total_steps and not stages.calls_spent(cfg, state):
            return "start_step"
        if cfg.use_slow_update and not state.final_validated:
            return "final_validate"
        if (selecting := final_select.next_selection_stage(cfg, state)) is not None:
            return selecting
        if cfg.eval_test and "baseline" not in state.tests:
            return "test_baseline"
        if cfg.eval_test and "best" not in state.tests:
            return "test_best"
        if cfg.eval_test and cfg.eval_without_skill and judged(cfg.env) and "no_skill" not in state.tests:
            return "test_no_skill"
        return None if state.completed else "complete"
    if (reviewing := review.next_stage(p)) is not None:  # the gate has decided: the step is under review
        return reviewing
    if p.rollout is None:
        return "rollout"
    if cfg.mode == "bank":
        return bank.next_bank_stage(cfg, state)
    if reflect.pending_minibatches(ctx, state):
        return "reflect"
    if p.merged is None:
        return "aggregate"
    if stages.skip_reason(state, cfg.update_mode):
        return "gate"
    if cfg.update_mode != "full_rewrite":  # full_rewrite has no budget: no learning rate, no select
        if cfg.lr_control == "autonomous" and p.learning_rate is None:
            return "learning_rate"
        if edit_screen.due(cfg, p):
            return "screen"
        if p.selected is None:
            return "select"
    if p.candidate is None:
        return "update"
    if candidate_check.due(cfg, p):
        return "check"
    if candidate_check.failed(p):
        return "gate"
    if p.evaluation is None:
        return "evaluate"
    if repair.due(cfg, p):
        return "repair"
    if blockers.due(cfg, state):
        return "blocker_search"
    return "gate"


def drive(ctx: RunContext, state: RunState, before_stage: Callable[[str], None] | None = None,
          stops: StopCheck | None = None, halt: bool = True) -> RunState:
    """Run stages until the run is complete, or until `stops` finds a stop
    condition at an event boundary: its event is appended and, with `halt`,
    the run returns there (verify passes the recorded stops and goes on). A
    stage whose calls failed too often (the circuit breaker) raises before
    its events are appended."""
    while (name := next_stage(ctx, state)) is not None:
        if before_stage is not None:
            before_stage(name)
        stop = stops(state, name) if stops is not None else None
        if stop is not None:
            if halt and already_stopped(state, stop):
                return state
            stored = ctx.log.append([stop], {})
            state = reduce(state, stop)
            ctx.report("event", "stop", state, stop, stored[0] if stored else None)
            if halt:
                return state
            continue
        ctx.report("stage", name, state)
        ctx.health.begin_stage(name)  # first: the stage's counts start here (work done ahead may add to the row)
        if ctx.call_index is not None:  # what other processes journaled meanwhile (a fork's parent, say)
            ctx.call_index.refresh(at_most_every=REFRESH_SECONDS)
        ahead.fetch(ctx, state, name)  # work the stages after this one will need (the background lanes)
        events = STAGES[name](ctx, state)
        ctx.health.end_stage()
        stored = ctx.log.append(events, ctx.take_blobs())
        for i, event in enumerate(events):
            state = reduce(state, event)
            ctx.report("event", name, state, event, stored[i] if i < len(stored) else None)
    return state


# Environment kinds by the config key `env`.
def env_of(store: Store, state: RunState, config: SkillConfig | None = None) -> SkillEnv:
    """The run's environment, with its stored settings, on the dataset snapshot stored in its log (played with
    progressive disclosure, `disclosure: tools`, over the skills the log installs). The paths the run names (its
    database file, data and skill sources) are named to the sandboxes first: no agent may see them."""
    name_database(store.url)
    name_run_paths([state.config.get("data"), state.config.get("initial_skill"),
                    *(state.config.get("distractor_skills") or ())])
    env = make_env(state.config.get("env", "qa"), state.config.get("env_config") or {}, dataset_of(store, state),
                   config)
    if state.config.get("disclosure") != "tools":
        return env
    from skillstate.envs.disclosure import disclosed

    return disclosed(env, installation_of(store, state), int(state.config.get("disclosure_max_calls", 8)))


def installation_of(store: Store, state: RunState) -> Any:
    """The skills a `disclosure: tools` run installs, read from its log: the trained skill's tree and the
    distractors."""
    from skillstate.envs.disclosure import Installation, installed_skill
    from skillstate.errors import CorruptLogError
    from skillstate.skilltree import decode_tree

    def tree(root: str) -> Any:
        return decode_tree(store.get_blob(root), store.get_blobs)

    if state.skill_tree is None:
        raise CorruptLogError("a run with disclosure: tools has no skill tree in its RunStarted")
    return Installation(tree(state.skill_tree), tuple(installed_skill(tree(h)) for h in state.distractors))


def dataset_of(store: Store, state: RunState) -> dict[str, list[dict[str, Any]]]:
    """The run's dataset snapshot: split -> items."""
    return {name: json.loads(store.get_blob(info["hash"])) for name, info in state.dataset.items()}


def make_backend(config: SkillConfig, env: SkillEnv, role: str) -> LLMClient:
    if config.backend == "sim":
        from skillstate.sim.backend import sim_backend_for

        return sim_backend_for(env, config.sim)
    from skillstate.llm.openai_backend import OpenAIBackend

    return OpenAIBackend(config.role_config(role), role)


BackendFactory = Callable[[SkillConfig, SkillEnv, str], LLMClient]


def check_backend_factory(config: SkillConfig, backend_factory: BackendFactory | None) -> None:
    """A custom backend factory runs on executor threads only (checked before a run is created, too)."""
    if backend_factory is not None and config.executor == "ray":
        raise ConfigError("executor ray builds the target's backend on each worker: a custom backend factory "
                          "runs on executor threads only")


def build_context(store: Store, run_id: str, state: RunState, config: SkillConfig, log: RunLog, *,
                  on_progress: ProgressCallback | None = None, verify_until=None,
                  backend_factory: BackendFactory | None = None) -> RunContext:
    """The context a run executes in. With `verify_until` (a timestamp) there
    is no backend: LLM responses come only from calls recorded until then."""
    env = env_of(store, state, config)
    prompts = {name: store.get_blob(h) for name, h in state.prompts.items()}
    scope = None if config.llm_cache == "all" else lineage_run_ids(store, run_id)
    factory = backend_factory or make_backend
    verifying = verify_until is not None
    if not verifying:
        check_backend_factory(config, backend_factory)
    budget = None if verifying else run_budget(store, run_id, config)
    health = CallHealth(0, 1.0) if verifying else CallHealth(config.max_consecutive_failures,
                                                              config.max_stage_failure_share)
    clients = {}
    index = None if verifying else CallIndex(store, scope)  # claims of requests it lacks ask the journal nothing
    for role in roles_of(state.kind, config.env):
        config.model_for(role)  # a missing model is a user error before anything runs
        backend = None if verifying else factory(config, env, role)
        # A Ray worker keeps the reply it was sent, so the target's claims there always ask the journal.
        indexed = None if role == "target" and config.executor == "ray" else index
        clients[role] = RecordingClient(backend, store, run_id=run_id, role=role, run_ids=scope,
                                        before=verify_until, budget=budget, health=health, index=indexed)
    ahead = {} if verifying else {  # work done ahead of time: own breaker counts, same journal
        role: client.sibling(AheadHealth(health)) for role, client in clients.items()}
    ctx = RunContext(store=store, run_id=run_id, config=config, env=env, prompts=prompts, clients=clients,
                     log=log, on_progress=on_progress, health=health, background_clients=ahead)
    ctx.call_index = index
    if config.mode == "bank" and config.bank.embedder != "sim":  # training and evaluation runs alike
        from skillstate.llm.embeddings import LOCAL_MODEL, JournaledEmbedder, LocalEmbeddings, OpenAIEmbeddings

        local = config.bank.embedder == "local"
        source = None if verifying else LocalEmbeddings() if local else OpenAIEmbeddings(config.optimizer)
        ctx.embedder = JournaledEmbedder(source, store, run_id=run_id, run_ids=scope, before=verify_until,
                                         model=LOCAL_MODEL if local else config.bank.embedding_model, budget=budget,
                                         batch=config.bank.embedding_batch)
    if "target" in clients:  # the executor that runs rollouts (training and evaluation runs)
        ctx.executor = make_executor(ctx, dataset_of(store, state))
    models: dict[str, list[str]] = {}  # one warning per model, whatever roles share it
    for role in roles_of(state.kind, config.env):
        models.setdefault(config.model_for(role), []).append(role)
    for model, roles in models.items():
        if verify_until is None and price_for(model, config.prices) is None:
            ctx.warn(f"no price for model {model!r} ({' and '.join(roles)}): its calls count as $0; "
                     f"add it with --set 'prices={{\"{model}\": [IN, OUT]}}' (USD per 1M tokens)")
    if state.skill_tree and verify_until is None and state.last_completed_step == 0 and not state.parent_run_id:
        for warning in skill_tree_warnings(store, state.skill_tree):  # at the start (and a resume before step 1)
            ctx.warn(warning)
    return ctx


def skill_tree_warnings(store: Store, root: str) -> list[str]:
    """What `skillstate skill check` warns about in the skill directory a run started from."""
    from skillstate.skilltree import decode_tree, validate_skill

    return [f"skill: {w}" for w in validate_skill(decode_tree(store.get_blob(root), store.get_blobs)).warnings]


def run_budget(store: Store, run_id: str, config: SkillConfig) -> Budget:
    """The run's cost budget, starting from what its requests so far cost."""
    spent = sum(sent_cost(store.paid_by_model(run_id), config.prices).values())
    return Budget(config.max_cost_usd, spent, config.prices)


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
    return stored_config(data)


def continue_run(store: Store, run_id: str, *, runtime: SkillConfig | None = None,
                 on_progress: ProgressCallback | None = None,
                 backend_factory: BackendFactory | None = None) -> RunState:
    """Run (or resume) `run_id` until it completes."""
    with RunLease(store, run_id) as lease:  # before anything is read to act on: one driver per run
        loaded = load_run(store, run_id, check_blobs=True)  # nothing is appended on top of a damaged blob
        config = config_of(loaded.state)
        if runtime is not None:
            config = with_runtime(config, runtime)
        seq, last_hash = loaded.log_position
        ctx = build_context(store, run_id, loaded.state, config, StoreLog(store, run_id, seq, last_hash, lease),
                            on_progress=on_progress, backend_factory=backend_factory)
        try:
            return review.drive_reviewed(ctx, loaded.state, drive, stops=StopConditions(config))
        except FatalLLMError as err:
            raise LLMStop(str(err), run_id, fatal=True) from None
        except EnvFailure as err:
            raise EnvStop(str(err), run_id) from None
        except CircuitOpen as err:
            raise LLMStop(f"stopped: {err}", run_id) from None
        except BudgetExhausted as err:
            raise BudgetStop(str(err), run_id) from None
        except SQLAlchemyError as err:
            reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
            raise StorageStop(f"database error: {redact(reason)}", run_id) from None
        finally:
            ctx.close()
