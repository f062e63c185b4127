"""What the stages need while a run executes: config, environment, prompts,
the recording LLM clients, the blob buffer, the event log and a worker pool."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from skillstate.bank.embedding import Embedder, SimEmbedder
from skillstate.config import SkillConfig
from skillstate.engine.lanes import FOREGROUND, Slots
from skillstate.engine.meter import CallMeter, CallProgress
from skillstate.engine.parsing import response_format
from skillstate.engine.rollout import run_rollout
from skillstate.envs.base import RolloutOutcome, SkillEnv
from skillstate.llm.base import CallResult, ChatRequest
from skillstate.llm.health import CallHealth
from skillstate.llm.recording import RecordingClient
from skillstate.log.events import Event
from skillstate.log.reducer import RunState
from skillstate.skilltree.blobs import decode_tree, encode_tree, is_tree_blob
from skillstate.skilltree.bundle import bundle, is_bundle, unbundle
from skillstate.storage.call_index import CallIndex
from skillstate.storage.lease import RunLease
from skillstate.storage.store import Store, StoredEvent
from skillstate.util import sha256_text

T = TypeVar("T")
BUNDLES_KEPT = 32  # trained trees held decoded at once (a stage reads a few skills many times)
R = TypeVar("R")


class Executor(Protocol):
    """Where rollouts run: the context holds one (ThreadsExecutor by default; engine.executors makes the
    config's), and the implementations depend on the context, not the other way round."""

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

        return run_rollout(ctx.env, ctx.config.env, skill, item, ctx.prompts, target, ctx.judge_call())

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Progress:
    """What the engine reports: a stage about to run, an event appended, or
    (kind "calls") the LLM calls of the stage under way so far, in `calls`.

    Reports of kind "calls" come at most about ten times a second while a
    stage's calls complete, possibly from a worker thread (one at a time),
    and once more, with `calls.final` set, before the stage's events are
    reported; `state` is then the state the stage started from. An exception
    a callback raises for one of them is dropped, except for the final one."""

    kind: str  # "stage" | "event" | "calls" | "warning" (then `stage` holds the message)
    stage: str
    state: RunState
    event: Event | None = None
    stored: StoredEvent | None = None
    calls: CallProgress | None = None


ProgressCallback = Callable[[Progress], None]


class RunLog(Protocol):
    def append(self, events: list[Event], blobs: dict[str, str]) -> list[StoredEvent]: ...


class StoreLog:
    """Appends to the store, continuing the run's hash chain, while this
    process holds the run's lease."""

    def __init__(self, store: Store, run_id: str, last_seq: int, last_hash: str, lease: RunLease | None = None):
        self.store, self.run_id, self.last_seq, self.last_hash = store, run_id, last_seq, last_hash
        self.lease = lease

    def append(self, events: list[Event], blobs: dict[str, str]) -> list[StoredEvent]:
        if self.lease is not None:
            self.lease.check()
        stored = self.store.append(self.run_id, events, last_seq=self.last_seq, last_hash=self.last_hash,
                                   blobs_to_put=blobs)
        if stored:
            self.last_seq, self.last_hash = stored[-1].seq, stored[-1].hash
        return stored


class RunContext:
    def __init__(self, *, store: Store, run_id: str, config: SkillConfig, env: SkillEnv, prompts: dict[str, str],
                 clients: dict[str, RecordingClient], log: RunLog, on_progress: ProgressCallback | None = None,
                 health: CallHealth | None = None, background_clients: dict[str, RecordingClient] | None = None):
        self.store = store
        self.run_id = run_id
        self.config = config
        self.env = env
        self.prompts = prompts
        self.clients = clients
        self.log = log
        self.on_progress = on_progress
        self.health = health or CallHealth(0, 1.0)
        self.background_clients = background_clients or {}
        self.call_index: CallIndex | None = None  # the requests the journal may hold (build_context sets it)
        self.embedder: Embedder = SimEmbedder()  # mode bank: retrieval and deduplication (build_context sets it)
        self.executor: Executor = ThreadsExecutor()  # where rollouts run (build_context sets the config's)
        self._blobs: dict[str, str] = {}
        self._bundles: OrderedDict[str, str] = OrderedDict()  # tree blob hash -> its bundle (see `skill`), the last few
        self._lock = threading.Lock()
        self._slots = Slots(config.concurrency)
        self._pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="skillstate")
        self._ahead = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="skillstate-ahead")
        self._local = threading.local()
        self._fetched: dict[tuple[str, ...], Future[None]] = {}
        self._dropped: set[tuple[str, ...]] = set()
        self._closing = False
        self._stage_state = RunState()
        budget = next((c.budget for c in clients.values() if c.budget is not None), None)
        self.meter = CallMeter(None if on_progress is None else self._report_calls,
                               None if budget is None else lambda: (budget.spent, budget.limit))

    def close(self) -> None:
        self._closing = True  # background work still waiting for a slot returns without running
        self._ahead.shutdown(wait=True, cancel_futures=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.executor.close()

    # -- blobs --------------------------------------------------------------

    def put_blob(self, text: str) -> str:
        h = sha256_text(text)
        if self.in_background:  # work done ahead keeps nothing but its calls
            return h
        with self._lock:
            self._blobs[h] = text
        return h

    def blob(self, h: str) -> str:
        with self._lock:
            text = self._blobs.get(h)
        return text if text is not None else self.store.get_blob(h)

    def _find_blobs(self, hashes: list[str]) -> dict[str, str]:
        with self._lock:
            found = {h: self._blobs[h] for h in hashes if h in self._blobs}
        rest = [h for h in hashes if h not in found]
        return {**found, **(self.store.get_blobs(rest) if rest else {})}

    def skill(self, h: str) -> str:
        """The skill text of blob `h` as stages use it: a markdown skill as it is, and a trained skill
        directory (a tree blob) as one self-contained bundle (`skilltree.bundle`)."""
        text = self.blob(h)
        if not is_tree_blob(text):
            return text
        with self._lock:
            found = self._bundles.get(h)
        if found is None:
            found = bundle(decode_tree(text, self._find_blobs))
        self._keep_bundle(h, found)
        return found

    def _keep_bundle(self, h: str, text: str) -> None:
        with self._lock:
            self._bundles[h] = text
            self._bundles.move_to_end(h)
            while len(self._bundles) > BUNDLES_KEPT:
                self._bundles.popitem(last=False)

    def put_skill(self, text: str) -> str:
        """Store a skill text as `skill` gives them (a bundle as its tree blob and file blobs); its hash."""
        if not is_bundle(text):
            return self.put_blob(text)
        encoded = encode_tree(unbundle(text), as_tree=True)
        for blob in encoded.blobs.values():
            self.put_blob(blob)
        if not self.in_background:
            self._keep_bundle(encoded.root_hash, text)
        return encoded.root_hash

    def take_blobs(self) -> dict[str, str]:
        with self._lock:
            out, self._blobs = self._blobs, {}
        return out

    # -- LLM calls ----------------------------------------------------------

    def llm(self, role: str, messages: list[dict[str, Any]], response_format: dict[str, Any] | None = None,
            tools: list[dict[str, Any]] | None = None, seed: int | None = None) -> CallResult:
        cfg = getattr(self.config, role)
        request = ChatRequest.build(self.config.backend, self.config.model_for(role), messages,
                                    cfg.temperature, cfg.max_tokens, response_format, tools, seed, cfg.extra_body)
        background = self.in_background
        if background:
            result = self.background_clients[role].complete(request)
        else:
            result = self._foreground(self.clients[role].complete, request)  # holds a slot unless its task does
        self.meter.record(served=result.cached, failed=result.error is not None, background=background)
        return result

    def judge_call(self) -> Callable[[list[dict[str, Any]], int | None], CallResult] | None:
        """The judge's calls for an environment that grades with one (None when the run has no judge)."""
        if "judge" not in self.clients:
            return None
        from skillstate.evals.judge import JudgeReply

        fmt = response_format(self.config.judge.response_format, JudgeReply)
        return lambda messages, seed: self.llm("judge", messages, fmt, seed=seed)

    def expect_calls(self, calls: int | None) -> None:
        """The stage under way plans `calls` more LLM calls (None: unknown), for the progress bar only."""
        if calls is not None and not self.in_background:
            self.meter.expect(calls)

    def rollout_calls(self, items: int) -> int | None:
        """The target calls of `items` rollouts: one each in a single-turn
        environment (QAEnv's rollout), else unknown (episodes and tool loops)."""
        from skillstate.envs.qa import QAEnv

        return items if type(self.env).rollout is QAEnv.rollout else None

    def optimizer(self, user: str, reply: type[BaseModel] | None = None) -> CallResult:
        """One optimizer call; `reply` is the shape the prompt asks for (sent as
        a JSON schema with `optimizer.response_format: json_schema`)."""
        fmt = response_format(self.config.optimizer.response_format, reply)
        return self.llm("optimizer", [{"role": "system", "content": self.prompts["optimizer_system"].strip()},
                                      {"role": "user", "content": user}], fmt)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """Run `fn` over items concurrently (up to `concurrency`), results in input order."""
        items = list(items)
        if len(items) <= 1:
            return [self._foreground(fn, item) for item in items]
        with self.burst(len(items)):
            return list(self._pool.map(lambda item: self._foreground(fn, item), items))

    def burst(self, n: int) -> contextlib.AbstractContextManager[None]:
        """Mark foreground work of `n` tasks: from `concurrency` tasks on, no speculative work starts meanwhile."""
        return self._slots.burst() if n >= self.config.concurrency else contextlib.nullcontext()

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run `fn(*args)` on the worker pool (the caller keeps at most `concurrency` in flight)."""
        return self._pool.submit(self._foreground, fn, *args)

    def _foreground(self, fn: Callable[..., R], *args: Any) -> R:
        if getattr(self._local, "held", False):  # already holding a slot (work nested in a task)
            return fn(*args)
        with self._slots.hold(FOREGROUND):
            self._local.held = True
            try:
                return fn(*args)
            finally:
                self._local.held = False

    # -- work done ahead ------------------------------------------------------

    @property
    def in_background(self) -> bool:
        return getattr(self._local, "background", False)

    def fetch_ahead(self, lane: str, key: tuple[str, ...], fn: Callable[..., Any], *args: Any) -> bool:
        """Run `fn(*args)` in a background `lane` (CERTAIN or SPECULATIVE),
        once per `key`, for its calls only: its result and any error are
        dropped (the stage that needs the work does it again, served from
        the call table). False when there is no background lane (verify) or
        `key` was fetched."""
        if not self.background_clients or key in self._fetched:
            return False
        self._fetched[key] = self._ahead.submit(self._background, lane, key, fn, *args)
        return True

    def cancel_ahead(self, obsolete: Callable[[tuple[str, ...]], bool]) -> None:
        """Drop the background work whose key is `obsolete` and that has not
        started (work already sending its calls finishes)."""
        for key, future in self._fetched.items():
            if obsolete(key) and not future.cancel():
                self._dropped.add(key)  # on a thread but still waiting for a slot: it returns at once

    def _background(self, lane: str, key: tuple[str, ...], fn: Callable[..., Any], *args: Any) -> None:
        with self._slots.hold(lane):
            if key in self._dropped or self._closing:
                return
            self._local.background = True
            try:
                fn(*args)
            except Exception:  # noqa: S110  (dropped: the stage that needs this work meets any error itself)
                pass
            finally:
                self._local.background = False

    @property
    def verifying(self) -> bool:
        """Re-executing against the recorded calls only (no backend)."""
        return any(client.backend is None for client in self.clients.values())

    def warn(self, message: str) -> None:
        self.report("warning", message, RunState())

    def report(self, kind: str, stage: str, state: RunState, event: Event | None = None,
               stored: StoredEvent | None = None) -> None:
        if kind == "stage":
            self._stage_state = state
            self.meter.begin(stage)
        elif kind == "event" and stage == self.meter.stage:
            self.meter.finish()  # the stage's last count of calls, before its events
        if self.on_progress is not None:
            self.on_progress(Progress(kind, stage, state, event, stored))

    def _report_calls(self, calls: CallProgress) -> None:
        assert self.on_progress is not None  # the meter reports only when there is a callback
        self.on_progress(Progress("calls", calls.stage, self._stage_state, calls=calls))


def item_view(env: SkillEnv, result: Any, trajectory: Any) -> dict[str, Any]:
    """One trajectory as the optimizer sees it."""
    view = env.describe_item(env.item(result.item_id))
    view.update(prediction=result.prediction, fail_reason=result.fail_reason,
                score={"hard": result.hard, "soft": round(result.soft, 3)})
    view.update(env.reflection_view(trajectory))
    return view
