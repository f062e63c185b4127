"""Reading a run back from its log: its lineage (a fork's inherited prefix,
then its own events), checked and folded into state. The commands that only
read (`runs`, `show`, `log`) come through here, so it imports what folding
needs and no more: the config's model and the blob walk when they are used."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from skillstate.errors import CorruptLogError, NotFoundError
from skillstate.log.events import BaselineEvaluated, Event, GateDecided, RunForked
from skillstate.log.reducer import RunState, fold
from skillstate.storage.chain import check_chain
from skillstate.storage.store import GENESIS, Store, StoredEvent

if TYPE_CHECKING:
    from skillstate.config import SkillConfig


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
    # cast: a GateDecided payload always holds its step (a required field of the event)
    last = max((cast(int, s.step) for s in stored if s.type == GateDecided.type), default=None)
    run = f"run {stored[-1].run_id!r}" if stored else "the run"
    if last is None and not any(s.type == BaselineEvaluated.type for s in stored):
        raise NotFoundError(f"step {step} is beyond the end of {run} (no baseline yet)")
    raise NotFoundError(f"step {step} is beyond the end of {run} (last completed step: {last or 0})")


def state_of(stored: list[StoredEvent]) -> RunState:
    return fold(s.event for s in stored)


def config_of(state: RunState) -> SkillConfig:
    from skillstate.config_views import stored_config

    return stored_config(dict(state.config))


def roles_of(kind: str, env: str | None = None) -> tuple[str, ...]:
    """The LLM roles a run of this kind calls: an evaluation run only has a target, and a policy training run
    only the teacher (the policy it trains runs here); an environment that grades with a judge (env evals)
    adds the judge to the runs that roll out."""
    roles = {"eval": ("target",), "policy": ("optimizer",)}.get(kind, ("target", "optimizer"))
    if env is not None and "target" in roles and judged(env):
        roles = (*roles, "judge")
    return roles


# The built-in environments that grade without a judge (envs.registry.BUILTIN but evals): known here by name, so
# that reading a run's log imports no environment.
UNJUDGED_BUILTINS = ("qa", "sql", "workspace", "textworld_express", "scienceworld")


def judged(env: str) -> bool:
    """Whether environment `env` grades with a judge (False for one that cannot be imported here: a log read
    where its environment is not installed)."""
    if env == "evals":
        return True
    if env in UNJUDGED_BUILTINS:
        return False
    from skillstate.envs.registry import resolve_env
    from skillstate.errors import ConfigError

    try:
        return bool(getattr(resolve_env(env), "uses_judge", False))
    except ConfigError:
        return False


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


def load_run(store: Store, run_id: str | None, *, check_blobs: bool = False) -> LoadedRun:
    """A run's lineage, checked (sequence, hash chain, signatures, readable
    payloads) and folded. A damaged log raises CorruptLogError: nothing is
    resumed, replayed or verified on top of it. With `check_blobs` (before
    anything is appended or re-executed) every blob the lineage names, and
    every blob those name, must be there and read back as its hash says."""
    row = store.require_run(run_id)
    try:
        lineage = lineage_events(store, row.run_id)
    except CorruptLogError:
        raise
    except Exception as err:  # an unreadable RunForked
        raise CorruptLogError(f"run {row.run_id}: the fork's first event cannot be read: {err}") from None
    decoded, problem = check_chain(lineage, key=store.audit_key)
    if problem:
        raise CorruptLogError(f"{problem}; the log of run {row.run_id} is damaged and nothing was done")
    if check_blobs:
        require_blobs(store, row.run_id, lineage, decoded)
    own = [s for s in lineage if s.run_id == row.run_id]
    try:
        state = fold(decoded)  # the events the chain check decoded, not decoded again
    except Exception as err:
        raise CorruptLogError(f"run {row.run_id}: the log cannot be folded: {err}") from None
    return LoadedRun(row.run_id, lineage, own, state)


def require_blobs(store: Store, run_id: str, stored: list[StoredEvent], decoded: list[Event]) -> None:
    """CorruptLogError naming the event and the blob if a blob `stored` depends on is missing or damaged."""
    from skillstate.storage.blob_walk import blob_damage

    problem = blob_damage(store, stored, decoded)
    if problem:
        raise CorruptLogError(f"{problem}; the log of run {run_id} is damaged and nothing was done")


def checked_prefix(store: Store, run_id: str, stored: list[StoredEvent]) -> None:
    """Refuse (CorruptLogError) to build on `stored`, a prefix of `run_id`'s lineage, if
    its chain or a blob it depends on is damaged (a fork checks what it inherits)."""
    decoded, problem = check_chain(stored, key=store.audit_key)
    if problem:
        raise CorruptLogError(f"{problem}; the log of run {run_id} is damaged and nothing was done")
    require_blobs(store, run_id, stored, decoded)
