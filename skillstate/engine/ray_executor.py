"""`executor: ray` on the driver: rollouts go to a pool of environment actors
(`ray_worker.EnvWorker`), and the driver answers their calls' claims and
journals their outcomes (`ray_worker.CallDesk`). The driver stays the only
process that touches the database.

The concurrency cap holds across the cluster: each rollout holds one of the
run context's slots (at most `concurrency`) for as long as its Ray task
runs, and there are at most `concurrency` actors. An actor whose process
dies is restarted and its task retried (up to `RETRIES` times); the retry is
served every call its first attempt journaled, and takes over the claim of
a request that attempt was still sending."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayError

from skillstate.config import redact
from skillstate.engine.executors import pool_size
from skillstate.envs.base import RolloutOutcome
from skillstate.errors import ConfigError, EnvFailure
from skillstate.llm.base import ChatResponse, FatalLLMError
from skillstate.llm.recording import RecordingClient

if TYPE_CHECKING:
    from skillstate.engine.context import RunContext

JOURNAL_WAIT = 120.0  # seconds a finished rollout waits for its calls' outcomes to reach the driver
RETRIES = 3  # restarts of an actor whose process died, and retries of the task it was running


class _LocalCluster:
    started = False  # whether this process started the Ray runtime it is connected to


_local_cluster = _LocalCluster()


def connect(cfg: Any) -> None:
    """Connect this process to Ray, once: to `ray_address`, or to a local cluster started for the run. Run
    creation does it before anything is written, so an unreachable cluster leaves no run behind."""
    if ray.is_initialized():
        return
    where = f"the Ray cluster at {redact(cfg.ray_address)}" if cfg.ray_address else "a local Ray cluster"
    unreachable = _unreachable(cfg.ray_address)
    if unreachable:  # Ray itself would retry for minutes
        raise ConfigError(f"executor ray: cannot join {where}: {unreachable}")
    try:
        with warnings.catch_warnings():  # Ray Client warns before it raises: the error below says it all
            warnings.simplefilter("ignore")
            ray.init(address=cfg.ray_address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
    except Exception as err:  # an address that is no cluster, a cluster that refuses us, a missing ray[client]
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"executor ray: cannot start or join {where}: {redact(first)[:300]}") from None
    _local_cluster.started = not cfg.ray_address


def _unreachable(address: str | None) -> str | None:
    """Why a cluster's HOST:PORT (or ray://HOST:PORT) takes no connection, if it does not; None for `auto`,
    no address, or one that answers."""
    if not address or address == "auto":
        return None
    hostport = address.split("://", 1)[-1].rsplit("@", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return None  # a form Ray reads itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        return f"{hostport} takes no connection ({err.strerror or type(err).__name__})"
    return None


class RayExecutor:
    def __init__(self, ctx: RunContext, splits: dict[str, list[dict[str, Any]]]):
        from skillstate.engine.ray_worker import CallDesk, EnvWorker, WorkerSpec

        cfg = ctx.config
        self.ctx = ctx
        connect(cfg)
        api_key = os.environ.get(cfg.target.api_key_env) if cfg.backend == "openai" else None
        spec = WorkerSpec(env=cfg.env, env_config=dict(cfg.env_config or {}), splits=splits,
                          config=cfg.model_dump(mode="json"), prompts=dict(ctx.prompts), api_key=api_key)
        desk = f"skillstate-desk-{uuid.uuid4().hex}"  # actors find it by name (a handle as an argument would be
        # an object-store argument, which Ray warns about for actors that restart)
        self.desk: Any = CallDesk.options(name=desk).remote(spec)  # type: ignore[attr-defined]
        actor = ray.remote(EnvWorker).options(num_cpus=cfg.ray_num_cpus, max_restarts=RETRIES,
                                              max_task_retries=RETRIES)
        size = pool_size(cfg.concurrency, cfg.ray_num_cpus, float(ray.cluster_resources().get("CPU", 1)))
        # each actor reads the spec from the desk, which lives as long as the run (and a restarted actor with it)
        self.workers: list[Any] = [actor.remote(desk) for _ in range(size)]
        self._idle: queue.Queue[Any] = queue.Queue()
        for worker in self.workers:
            self._idle.put(worker)
        self._stops: dict[str, BaseException] = {}  # task -> the error its refused call raised on the driver
        self._tasks: set[str] = set()
        self._journaled: dict[tuple[str, str], int] = {}  # (task, attempt) -> its outcomes journaled so far
        self._journal_done = threading.Condition()
        self._closing = False
        self._handlers = ThreadPoolExecutor(max_workers=cfg.concurrency + 4, thread_name_prefix="skillstate-desk")
        self._service = threading.Thread(target=self._serve_desk, name="skillstate-desk", daemon=True)
        self._service.start()

    # -- rollouts -------------------------------------------------------------

    def rollout(self, ctx: RunContext, skill: str, item: dict[str, Any], sample: int | None) -> RolloutOutcome:
        task = uuid.uuid4().hex  # the same for every retry of this rollout: it owns the calls it claims
        self._tasks.add(task)
        worker = self._idle.get()
        try:
            kind, value, attempt, left = ray.get(worker.rollout.remote(task, skill, item, sample,
                                                                      ctx.in_background))
            self._await_journaled(task, attempt, left)
        except RayError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise EnvFailure(f"env {ctx.config.env!r} failed on item {item['id']!r}: the Ray worker failed "
                             f"({type(err).__name__}: {first[:200]})") from None
        finally:
            self._idle.put(worker)
            self._tasks.discard(task)
            for client in self._clients():
                client.release_all({task})
            with self._journal_done:
                for key in [k for k in self._journaled if k[0] == task]:
                    del self._journaled[key]
        stop = self._stops.pop(task, None)
        if stop is not None:  # a refused claim, a fatal error, or the journal failing under one of its calls
            raise stop
        if kind == "ok":
            return value
        raise EnvFailure(value)

    def _await_journaled(self, task: str, attempt: str, left: int) -> None:
        """Until the `left` outcomes that attempt left at the desk are in the journal (or failed to be)."""
        with self._journal_done:
            if not self._journal_done.wait_for(lambda: self._journaled.get((task, attempt), 0) >= left,
                                               timeout=JOURNAL_WAIT):
                raise EnvFailure(f"the driver did not receive the outcomes of {left} calls within {JOURNAL_WAIT} s "
                                 "(the Ray call desk is gone)")

    # -- the driver's end of the call desk -----------------------------------------

    def _serve_desk(self) -> None:
        """Take the workers' asks in the order they were made. Outcomes are journaled here, one after the
        other, before any later claim is looked at; claims wait on other threads (a claim may wait for the
        same request in flight elsewhere)."""
        while not self._closing:
            try:
                asks = ray.get(self.desk.take.remote(64, 0.25))
            except Exception:  # noqa: S112  (the desk is gone: the rollouts waiting on it fail on their own)
                if self._closing:
                    return
                continue
            for ask, kind, payload in asks:
                if kind == "claim":
                    self._handlers.submit(self._answer_claim, ask, payload)
                else:
                    self._record(*payload)

    def _answer_claim(self, ask: int, payload: tuple[Any, ...]) -> None:
        self.desk.answer.remote(ask, self._claim(*payload))

    def _client(self, background: bool) -> RecordingClient:
        return (self.ctx.background_clients if background else self.ctx.clients)["target"]

    def _clients(self) -> list[RecordingClient]:
        out = [self.ctx.clients["target"]]
        if "target" in self.ctx.background_clients:
            out.append(self.ctx.background_clients["target"])
        return out

    def _claim(self, task: str, h: str, background: bool) -> tuple[str, Any]:
        client = self._client(background)
        try:
            served = client.claim(h, owner=task)
            if served is not None:
                self.ctx.meter.record(served=True, failed=served.error is not None, background=background)
                return "served", served
            try:
                client.may_send()
            except BaseException:
                client.release(h)
                raise
            return "send", None
        except Exception as err:
            self._stops.setdefault(task, err)
            return "stop", None

    def _record(self, task: str, attempt: str, h: str, model: str, body: str, response: dict[str, Any] | None,
                error: str | None, latency: float, fatal: bool, background: bool) -> None:
        client = self._client(background)
        try:
            if fatal:  # as on threads: the run stops, and the call is not journaled
                err = FatalLLMError(error)
                client.health.trip(err)
                raise err
            result = client.record(model, h, body, ChatResponse.from_dict(response) if response else None,
                                   error, latency)
            self.ctx.meter.record(served=False, failed=result.error is not None, background=background)
        except Exception as err:
            self._stops.setdefault(task, err)
        finally:
            client.release(h)
            with self._journal_done:
                self._journaled[(task, attempt)] = self._journaled.get((task, attempt), 0) + 1
                self._journal_done.notify_all()

    def close(self) -> None:
        self._closing = True
        self._service.join(timeout=5)
        self._handlers.shutdown(wait=False, cancel_futures=True)
        for client in self._clients():
            client.release_all(set(self._tasks))
        for worker in self.workers:
            ray.kill(worker)
        ray.kill(self.desk)
        if _local_cluster.started:  # the local cluster this process started for its run: stopped with it
            ray.shutdown()
            _local_cluster.started = False
