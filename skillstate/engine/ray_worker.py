"""The Ray side of `executor: ray`: the environment actors that run
rollouts, and the call desk through which they reach the driver's journal.

A worker never opens the database. For each target call it asks the driver,
through the desk, to claim the request: the driver answers with the reply
the journal holds, or lets this worker send it. The worker then sends the
request to the endpoint itself and hands the outcome back through the desk;
the driver journals it before answering, so a call the worker saw complete
is in the journal even if the worker dies the next moment (its task is
retried and served that call from the journal)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import ray

from skillstate.config import SkillConfig, validate_config
from skillstate.engine.executors import run_rollout
from skillstate.errors import EnvFailure
from skillstate.llm.base import CallFailed, CallResult, ChatRequest, FatalLLMError
from skillstate.llm.recording import failure_text
from skillstate.util import canonical_json, sha256_text

# What the desk's asks and answers are: ("claim", (task, hash, background)) -> ("served", CallResult) |
# ("send", None) | ("stop", None); ("record", (task, hash, model, body, response, error, latency, fatal,
# background)) -> ("done", CallResult) | ("stop", None). "stop": the driver holds the error that stops the run.


class Stopped(Exception):
    """The driver refused a call (budget, circuit breaker, a fatal error): the rollout ends here."""


@dataclass(frozen=True)
class WorkerSpec:
    """What every environment actor is built from (put in the object store once per run)."""

    env: str
    env_config: dict[str, Any]
    splits: dict[str, list[dict[str, Any]]]
    config: dict[str, Any]
    prompts: dict[str, str]
    api_key: str | None  # the target's key, for workers whose environment lacks it


@ray.remote(num_cpus=0)
class CallDesk:
    """Asks from workers, queued for the driver, which takes them in batches and answers each."""

    def __init__(self) -> None:
        self._pending: asyncio.Queue[tuple[int, str, tuple[Any, ...]]] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next = 0

    async def ask(self, kind: str, payload: tuple[Any, ...]) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._next += 1
        self._waiting[self._next] = future
        self._pending.put_nowait((self._next, kind, payload))
        return await future

    async def take(self, limit: int, timeout: float) -> list[tuple[int, str, tuple[Any, ...]]]:
        try:
            first = await asyncio.wait_for(self._pending.get(), timeout)
        except asyncio.TimeoutError:
            return []
        out = [first]
        while len(out) < limit and not self._pending.empty():
            out.append(self._pending.get_nowait())
        return out

    async def answer(self, ask: int, reply: Any) -> None:
        future = self._waiting.pop(ask, None)
        if future is not None and not future.done():  # its worker may have died meanwhile
            future.set_result(reply)


class EnvWorker:
    """One environment instance (a Ray actor, restarted if its process dies)."""

    def __init__(self, spec: WorkerSpec, desk: Any):
        from skillstate.engine.runner import make_backend
        from skillstate.envs.registry import make_env

        self.config: SkillConfig = validate_config(spec.config)
        if spec.api_key and not os.environ.get(self.config.target.api_key_env):
            os.environ[self.config.target.api_key_env] = spec.api_key
        self.env = make_env(spec.env, spec.env_config, spec.splits, self.config)
        self.backend = make_backend(self.config, self.env, "target")
        self.prompts = spec.prompts
        self.desk = desk

    def pid(self) -> int:
        return os.getpid()

    def rollout(self, task: str, skill: str, item: dict[str, Any], sample: int | None,
                background: bool) -> tuple[str, Any]:
        """("ok", RolloutOutcome), ("env", the EnvFailure message) or ("stopped", None)."""
        cfg = self.config

        def target(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult:
            request = ChatRequest.build(cfg.backend, cfg.model_for("target"), messages, cfg.target.temperature,
                                        cfg.target.max_tokens, None, tools, sample)
            return self._complete(task, request, background)

        try:
            return "ok", run_rollout(self.env, cfg.env, skill, item, self.prompts, target)
        except Stopped:
            return "stopped", None
        except EnvFailure as err:
            return "env", str(err)

    def _complete(self, task: str, request: ChatRequest, background: bool) -> CallResult:
        body = canonical_json(request.to_dict())
        h = sha256_text(body)
        kind, value = ray.get(self.desk.ask.remote("claim", (task, h, background)))
        if kind == "served":
            return value
        if kind == "stop":
            raise Stopped()
        start = time.perf_counter()
        response, error, fatal = None, None, None
        try:
            response = self.backend.complete(request).to_dict()
        except FatalLLMError as err:
            fatal = failure_text(err, plain=True)
        except CallFailed as err:
            error = failure_text(err, plain=True)
        except Exception as err:  # the backend's own failure: one failed call, as on threads
            error = failure_text(err)
        latency = (time.perf_counter() - start) * 1000
        kind, value = ray.get(self.desk.ask.remote(
            "record", (task, h, request.model, body, response, error, latency, fatal, background)))
        if kind == "stop":
            raise Stopped()
        return value
