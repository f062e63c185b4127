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
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayError

from skillstate.config import redact
from skillstate.engine.executors import pool_size
from skillstate.envs.base import RolloutOutcome
from skillstate.envs.disclosure import installation_of_env
from skillstate.errors import ConfigError, EnvFailure
from skillstate.llm.base import ChatResponse, FatalLLMError
from skillstate.llm.recording import RecordingClient
from skillstate.util import first_line, register_secret

if TYPE_CHECKING:
    from skillstate.engine.context import RunContext

JOURNAL_WAIT = 120.0  # seconds a finished rollout waits for its calls' outcomes to reach the driver
RETRIES = 3  # both the restarts of an actor whose process died and the retries of the task it was running
READY_WAIT = 120.0  # seconds the environment actors have to start
CLOSE_WAIT = 10.0  # seconds the actors have to close their environments at the end


class _Over(Exception):
    """A claim granted after its rollout ended."""


class _LocalCluster:
    started = False  # whether this process started the Ray runtime it is connected to


_local_cluster = _LocalCluster()


def connect(cfg: Any) -> None:
    """Connect this process to Ray, once: to `ray_address`, or to a local cluster started for the run. Run
    creation does it before anything is written, so an unreachable cluster leaves no run behind."""
    if not ray.is_initialized():
        _join(cfg)
    if cfg.ray_address:  # a cluster may grow (an autoscaler adds nodes): its actors get READY_WAIT to start
        return
    largest = max((node["Resources"].get("CPU", 0.0) for node in ray.nodes() if node.get("Alive")), default=0.0)
    if cfg.ray_num_cpus > largest:
        raise ConfigError(f"executor ray: ray_num_cpus={cfg.ray_num_cpus:g} is more than this machine's Ray has "
                          f"({largest:g} CPUs): no environment actor could start")


def _join(cfg: Any) -> None:
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
        raise ConfigError(f"executor ray: cannot start or join {where}: {redact(first_line(err))[:300]}") from None
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


class _Actors:
    """The idle environment actors. A foreground rollout waiting for one goes before work done ahead (the
    lanes' rule, for when there are fewer actors than slots)."""

    def __init__(self, actors: list[Any]):
        self._free = list(actors)
        self._foreground_waiting = 0
        self._cond = threading.Condition()

    @contextmanager
    def take(self, background: bool) -> Iterator[Any]:
        with self._cond:
            if not background:
                self._foreground_waiting += 1
            try:
                while not self._free or (background and self._foreground_waiting):
                    self._cond.wait()
            finally:
                if not background:
                    self._foreground_waiting -= 1
            actor = self._free.pop()
        try:
            yield actor
        finally:
            with self._cond:
                self._free.append(actor)
                self._cond.notify_all()


class RayExecutor:
    def __init__(self, ctx: RunContext, splits: dict[str, list[dict[str, Any]]]):
        from skillstate.engine.ray_worker import CallDesk, EnvWorker, WorkerSpec

        cfg = ctx.config
        self.ctx = ctx
        connect(cfg)
        api_key = os.environ.get(cfg.target.api_key_env) if cfg.backend == "openai" else None
        register_secret(api_key)  # masked in what the workers' errors bring back (the workers register it too)
        spec = WorkerSpec(env=cfg.env, env_config=dict(cfg.env_config or {}), splits=splits,
                          config=cfg.model_dump(mode="json"), prompts=dict(ctx.prompts), api_key=api_key,
                          installation=installation_of_env(ctx.env))
        desk = f"skillstate-desk-{uuid.uuid4().hex}"  # actors find it by name (a handle as an argument would be
        # an object-store argument, which Ray warns about for actors that restart)
        self.desk: Any = CallDesk.options(name=desk).remote(spec)  # type: ignore[attr-defined]
        actor = ray.remote(EnvWorker).options(num_cpus=cfg.ray_num_cpus, max_restarts=RETRIES,
                                              max_task_retries=RETRIES)
        size = pool_size(cfg.concurrency, cfg.ray_num_cpus, float(ray.cluster_resources().get("CPU", 1)))
        # each actor reads the spec from the desk, which lives as long as the run (and a restarted actor with it)
        self.workers: list[Any] = [actor.remote(desk) for _ in range(size)]
        self._wait_ready(cfg.ray_num_cpus)
        self._idle = _Actors(self.workers)
        self._attempts: dict[str, list[str]] = {}  # task -> its attempts so far (the last one is alive)
        self._stops: dict[str, BaseException] = {}  # task -> the error its refused call raised on the driver
        self._tasks: set[str] = set()  # rollouts under way
        self._lock = threading.Lock()
        self._journaled: dict[tuple[str, str], int] = {}  # (task, attempt) -> its outcomes journaled so far
        self._journal_done = threading.Condition()
        self._closing = False
        self._handlers = ThreadPoolExecutor(max_workers=cfg.concurrency + 4, thread_name_prefix="skillstate-desk")
        self._service = threading.Thread(target=self._serve_desk, name="skillstate-desk", daemon=True)
        self._service.start()

    def _wait_ready(self, num_cpus: float) -> None:
        """Until every actor has started; a ConfigError (after cleaning up) if one cannot be placed or built."""
        ready = [worker.ready.remote() for worker in self.workers]
        try:
            _, pending = ray.wait(ready, num_returns=len(ready), timeout=READY_WAIT)
            if not pending:
                ray.get(ready)
                return
            problem = (f"{len(pending)} of {len(ready)} environment actors did not start within {READY_WAIT:g} s "
                       f"(each reserves ray_num_cpus={num_cpus:g}; the cluster has "
                       f"{ray.cluster_resources().get('CPU', 0):g} CPUs)")
        except RayError as err:  # an actor's constructor raised: the environment cannot be built there
            cause = getattr(err, "cause", None) or err
            problem = f"an environment actor failed to start: {redact(first_line(cause))[:300]}"
        self._kill_all()
        raise ConfigError(f"executor ray: {problem}")

    # -- rollouts -------------------------------------------------------------

    def rollout(self, ctx: RunContext, skill: str, item: dict[str, Any], sample: int | None) -> RolloutOutcome:
        task = uuid.uuid4().hex  # the same for every retry of this rollout: it owns the calls it claims
        background = ctx.in_background
        with self._lock:
            self._tasks.add(task)
        try:
            with self._idle.take(background) as worker:
                kind, value, attempt, left = ray.get(worker.rollout.remote(task, skill, item, sample, background))
            self._await_journaled(task, attempt, left)
        except (RayError, ConnectionError) as err:  # the actor died for good, or the cluster went away
            stop = self._stops.pop(task, None)
            if stop is not None:
                raise stop from None
            raise EnvFailure(f"env {ctx.config.env!r} failed on item {item['id']!r}: the Ray worker failed "
                             f"({type(err).__name__}: {first_line(err, '')[:200]})") from None
        finally:
            with self._lock:
                self._tasks.discard(task)
                self._attempts.pop(task, None)
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
                raise EnvFailure(f"the outcomes of {left} calls did not reach the journal within {JOURNAL_WAIT:g} s "
                                 "(the Ray call desk is gone, or the database is that slow)")

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
                time.sleep(0.5)
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

    def _claim(self, task: str, attempt: str, h: str, background: bool) -> tuple[str, Any]:
        with self._lock:
            if task not in self._tasks:  # that rollout is over (a dead attempt's claim, answered late)
                return "stop", None
            seen = self._attempts.setdefault(task, [])
            if attempt not in seen:  # a retry's first claim supersedes the attempt that died
                seen.append(attempt)
            elif attempt != seen[-1]:  # a late claim of an attempt that died
                return "stop", None
        try:
            client = self._client(background)
            served = client.claim(h, owner=task)
            if served is not None:
                self.ctx.meter.record(served=True, failed=served.error is not None, background=background)
                return "served", served
            try:
                with self._lock:
                    if task not in self._tasks:
                        raise _Over()
                client.may_send()
            except BaseException:
                client.release(h, task)
                raise
            return "send", None
        except _Over:
            return "stop", None
        except Exception as err:
            self._stops.setdefault(task, err)
            return "stop", None

    def _record(self, task: str, attempt: str, h: str, model: str, body: str, response: dict[str, Any] | None,
                error: str | None, latency: float, fatal: bool, background: bool) -> None:
        with self._lock:
            stale = task not in self._tasks or self._attempts.get(task, [attempt])[-1] != attempt
        try:
            if stale:  # an attempt a retry superseded: the retry sends and journals this call itself
                return
            client = self._client(background)
            try:
                if fatal:  # as on threads: the run stops, and the call is not journaled
                    err = FatalLLMError(error)
                    client.health.trip(err)
                    raise err
                result = client.record(model, h, body, ChatResponse.from_dict(response) if response else None,
                                       error, latency)
                self.ctx.meter.record(served=False, failed=result.error is not None, background=background)
            finally:
                client.release(h, task)
        except Exception as err:
            self._stops.setdefault(task, err)
        finally:
            with self._journal_done:
                self._journaled[(task, attempt)] = self._journaled.get((task, attempt), 0) + 1
                self._journal_done.notify_all()

    def close(self) -> None:
        self._closing = True
        self._service.join(timeout=5)
        self._handlers.shutdown(wait=False, cancel_futures=True)
        for client in self._clients():
            client.release_all(set(self._tasks))
        try:  # let each actor close its environment (a text world's processes) before it is killed
            ray.wait([worker.close.remote() for worker in self.workers], num_returns=len(self.workers),
                     timeout=CLOSE_WAIT)
        except Exception:  # noqa: S110  (closing is best effort: the actors are killed next)
            pass
        self._kill_all()

    def _kill_all(self) -> None:
        for handle in [*self.workers, self.desk]:
            try:
                ray.kill(handle)
            except Exception:  # noqa: S110  (already gone, or the cluster is)
                pass
        if _local_cluster.started:  # the local cluster this process started for its run: stopped with it
            _local_cluster.started = False
            try:
                ray.shutdown()
            except Exception:  # noqa: S110
                pass
