"""The Ray side of `executor: ray`: the environment actors that run
rollouts, and the call desk through which they reach the driver's journal.

A worker never opens the database. For each target call it asks the driver,
through the desk, to claim the request: the driver answers with the reply
the journal holds, or lets this worker send it. The worker then sends the
request to the endpoint itself and leaves the outcome at the desk before it
goes on, so a call the worker saw complete reaches the journal even if the
worker dies the next moment. The driver journals the outcomes in the order
they were left, before it looks at any later claim: the retried task is
served that call from the journal. A rollout's result reaches the stage only
once every call it left is journaled."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray

from skillstate.config import SkillConfig
from skillstate.config_views import validate_config
from skillstate.engine.rollout import run_rollout
from skillstate.errors import EnvFailure
from skillstate.llm.base import CallFailed, CallResult, ChatRequest, ChatResponse, FatalLLMError
from skillstate.llm.recording import failure_text, result_of
from skillstate.util import canonical_json, sha256_text

# A claim asked at the desk: ("claim", (task, attempt, hash, background)) -> ("served", CallResult) | ("send", None) |
# ("stop", None) ("stop": the driver holds the error that stops the run). An outcome left there, unanswered:
# ("record", (task, attempt, hash, model, body, response, error, latency, fatal, background)).


class CallRefused(Exception):
    """The driver refused a call (budget, circuit breaker, a fatal error; the driver holds that error):
    the rollout ends here."""


@dataclass(frozen=True)
class WorkerSpec:
    """What every environment actor is built from: held by the run's call desk, where each actor (and a
    restarted one) reads it."""

    env: str
    env_config: dict[str, Any]
    splits: dict[str, list[dict[str, Any]]]
    config: dict[str, Any]
    prompts: dict[str, str]
    api_key: str | None  # the target's key, for workers whose environment lacks it
    installation: Any = None  # disclosure tools: the skills installed (envs.disclosure.Installation)


@ray.remote(num_cpus=0)
class CallDesk:
    """Asks from workers, queued for the driver, which takes them in batches and answers each; and the spec
    every environment actor is built from."""

    def __init__(self, spec: WorkerSpec) -> None:
        self._spec = spec
        self._pending: asyncio.Queue[tuple[int, str, tuple[Any, ...]]] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next = 0

    async def spec(self) -> WorkerSpec:
        return self._spec

    async def ask(self, kind: str, payload: tuple[Any, ...]) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._next += 1
        self._waiting[self._next] = future
        self._pending.put_nowait((self._next, kind, payload))
        return await future

    async def tell(self, kind: str, payload: tuple[Any, ...]) -> None:
        self._pending.put_nowait((0, kind, payload))

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

    def __init__(self, desk_name: str):
        from skillstate.engine.runner import make_backend
        from skillstate.envs.registry import make_env

        desk = ray.get_actor(desk_name)
        spec: WorkerSpec = ray.get(desk.spec.remote())
        self.config: SkillConfig = validate_config(spec.config)
        if spec.api_key and not os.environ.get(self.config.target.api_key_env):
            os.environ[self.config.target.api_key_env] = spec.api_key
        self.env = make_env(spec.env, spec.env_config, spec.splits, self.config)
        if spec.installation is not None:
            from skillstate.envs.disclosure import disclosed

            self.env = disclosed(self.env, spec.installation, self.config.disclosure_max_calls)
        self.backend = make_backend(self.config, self.env, "target")
        self.prompts = spec.prompts
        self.desk = desk
        self._left = 0  # outcomes this attempt left at the desk

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()

    def rollout(self, task: str, skill: str, item: dict[str, Any], sample: int | None,
                background: bool) -> tuple[str, Any, str, int]:
        """(kind, value, this attempt's id, the outcomes it left at the desk); kind and value are "ok" and the
        RolloutOutcome, "env" and the EnvFailure message, or "stopped" and None."""
        cfg = self.config
        attempt, self._left = uuid.uuid4().hex, 0

        def target(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult:
            request = ChatRequest.build(cfg.backend, cfg.model_for("target"), messages, cfg.target.temperature,
                                        cfg.target.max_tokens, None, tools, sample, cfg.target.extra_body)
            return self._complete(task, attempt, request, background)

        try:
            return "ok", run_rollout(self.env, cfg.env, skill, item, self.prompts, target), attempt, self._left
        except CallRefused:
            return "stopped", None, attempt, self._left
        except EnvFailure as err:
            return "env", str(err), attempt, self._left

    def _complete(self, task: str, attempt: str, request: ChatRequest, background: bool) -> CallResult:
        body = canonical_json(request.to_dict())
        h = sha256_text(body)
        kind, value = ray.get(self.desk.ask.remote("claim", (task, attempt, h, background)))
        if kind == "served":
            return value
        if kind == "stop":
            raise CallRefused()
        start = time.perf_counter()
        reply: ChatResponse | None = None
        error, fatal = None, None
        try:
            reply = self.backend.complete(request)
        except FatalLLMError as err:
            fatal = failure_text(err, plain=True)
        except CallFailed as err:
            error = failure_text(err, plain=True)
        except Exception as err:  # the backend's own failure: one failed call, as on threads
            error = failure_text(err)
        latency = (time.perf_counter() - start) * 1000
        response = reply.to_dict() if reply is not None else None
        self.desk.tell.remote("record", (task, attempt, h, request.model, body, response, error or fatal, latency,
                                         fatal is not None, background))
        self._left += 1
        if fatal is not None:
            raise CallRefused()
        return result_of(h, "target", reply, error)  # what the driver's journal answers for it (the target's
        # replies are never unusable: only the optimizer's can be)
