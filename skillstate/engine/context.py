"""What the stages need while a run executes: config, environment, prompts,
the recording LLM clients, the blob buffer, the event log and a worker pool."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from skillstate.config import SkillConfig
from skillstate.engine.parsing import response_format
from skillstate.envs.base import SkillEnv
from skillstate.events import Event
from skillstate.lease import RunLease
from skillstate.llm.base import CallResult, ChatRequest
from skillstate.llm.health import CallHealth
from skillstate.llm.recording import RecordingClient
from skillstate.reducer import RunState
from skillstate.store import Store, StoredEvent
from skillstate.util import sha256_text

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Progress:
    """What the engine reports: a stage about to run, or an event appended."""

    kind: str  # "stage" | "event" | "warning" (then `stage` holds the message)
    stage: str
    state: RunState
    event: Event | None = None
    stored: StoredEvent | None = None


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
                 health: CallHealth | None = None):
        self.store = store
        self.run_id = run_id
        self.config = config
        self.env = env
        self.prompts = prompts
        self.clients = clients
        self.log = log
        self.on_progress = on_progress
        self.health = health or CallHealth(0, 1.0)
        self._blobs: dict[str, str] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="skillstate")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- blobs --------------------------------------------------------------

    def put_blob(self, text: str) -> str:
        h = sha256_text(text)
        with self._lock:
            self._blobs[h] = text
        return h

    def blob(self, h: str) -> str:
        with self._lock:
            text = self._blobs.get(h)
        return text if text is not None else self.store.get_blob(h)

    def take_blobs(self) -> dict[str, str]:
        with self._lock:
            out, self._blobs = self._blobs, {}
        return out

    # -- LLM calls ----------------------------------------------------------

    def llm(self, role: str, messages: list[dict[str, Any]], response_format: dict[str, Any] | None = None,
            tools: list[dict[str, Any]] | None = None) -> CallResult:
        cfg = getattr(self.config, role)
        request = ChatRequest.build(self.config.backend, self.config.model_for(role), messages,
                                    cfg.temperature, cfg.max_tokens, response_format, tools)
        return self.clients[role].complete(request)

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
            return [fn(item) for item in items]
        return list(self._pool.map(fn, items))

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run `fn(*args)` on the worker pool (the caller keeps at most `concurrency` in flight)."""
        return self._pool.submit(fn, *args)

    @property
    def verifying(self) -> bool:
        """Re-executing against the recorded calls only (no backend)."""
        return any(client.backend is None for client in self.clients.values())

    def warn(self, message: str) -> None:
        self.report("warning", message, RunState())

    def report(self, kind: str, stage: str, state: RunState, event: Event | None = None,
               stored: StoredEvent | None = None) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(kind, stage, state, event, stored))


def item_view(env: SkillEnv, result: Any, trajectory: Any) -> dict[str, Any]:
    """One trajectory as the optimizer sees it."""
    view = env.describe_item(env.item(result.item_id))
    view.update(prediction=result.prediction, fail_reason=result.fail_reason,
                score={"hard": result.hard, "soft": round(result.soft, 3)})
    view.update(env.reflection_view(trajectory))
    return view
