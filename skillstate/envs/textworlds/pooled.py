"""What the JVM text worlds share: an `EpisodeEnv` whose episodes each hold
a world process from a pool, with a one-process pool of its own for the
reference paths (cached per item) and for the sim agent's reference
sessions.

A subclass says how its world starts, loads an item and gives its gold path
(the hooks of `PooledEpisodeEnv`); the pools, their locking, the cache and
the sessions' lending and giving back live here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from skillstate.envs.episode import EpisodeEnv
from skillstate.envs.textworlds.pool import PooledSession, ProcessPool, Worker

S = TypeVar("S", bound=PooledSession)


class PooledEpisodeEnv(EpisodeEnv, Generic[S]):
    """Episodes in pooled world processes. A subclass sets `env_name` (the
    pools' names and error messages) and implements the hooks:
    - `_start()`: start one process;
    - `_load(worker, item, gold)`: load (or reset) the process to the item:
      (goal, first observation); `gold` asks the world for its gold path too;
    - `_gold_path(worker)`: the gold path of the item just loaded with `gold`;
    - `_session(pool, worker, item, goal, observation)`: the episode's session.
    """

    env_name: ClassVar[str]

    def __init__(self, splits: dict[str, list[dict[str, Any]]], config: BaseModel | None = None):
        super().__init__(splits, config)
        self._pool: ProcessPool | None = None
        self._reference_pool: ProcessPool | None = None
        self._references: dict[str, tuple[str, str, list[str]]] = {}
        self._lock = threading.Lock()

    # -- hooks -----------------------------------------------------------------

    def _start(self) -> Worker:
        raise NotImplementedError

    def _load(self, worker: Worker, item: dict[str, Any], gold: bool) -> tuple[str, str]:
        raise NotImplementedError

    def _gold_path(self, worker: Worker) -> Iterable[Any]:
        raise NotImplementedError

    def _session(self, pool: ProcessPool, worker: Worker, item: dict[str, Any], goal: str, observation: str) -> S:
        raise NotImplementedError

    # -- processes -------------------------------------------------------------

    def pool(self) -> ProcessPool:
        """The episodes' processes: at most `settings.workers`."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPool(self._start, lambda: self.settings.workers, self.env_name)
            return self._pool

    def _ref_pool(self) -> ProcessPool:
        # One process of its own: the sim agent asks for references while its
        # episode holds a process, so sharing the episodes' pool could deadlock.
        with self._lock:
            if self._reference_pool is None:
                self._reference_pool = ProcessPool(self._start, lambda: 1, f"{self.env_name} references")
            return self._reference_pool

    def close(self) -> None:
        for pool in (self._pool, self._reference_pool):
            if pool is not None:
                pool.close()

    # -- episodes --------------------------------------------------------------

    def open(self, item: dict[str, Any], seed: int) -> S:
        return self._open_in(self.pool(), item)

    def reference_session(self, item: dict[str, Any]) -> S:
        return self._open_in(self._ref_pool(), item)

    def _open_in(self, pool: ProcessPool, item: dict[str, Any]) -> S:
        worker = pool.acquire()
        try:
            goal, obs = self._load(worker, item, gold=False)
        except BaseException:
            pool.release(worker, discard=True)
            raise
        return self._session(pool, worker, item, goal, obs)

    def reference_actions(self, item: dict[str, Any]) -> tuple[str, str, list[str]]:
        """The world's gold path, cached per item (a process of its own loads it)."""
        with self._lock:
            cached = self._references.get(item["id"])
        if cached is None:
            with self._ref_pool().lease() as worker:
                goal, obs = self._load(worker, item, gold=True)
                cached = (goal, obs, [str(a) for a in self._gold_path(worker)])
            with self._lock:
                self._references[item["id"]] = cached
        return cached[0], cached[1], list(cached[2])
