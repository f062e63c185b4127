"""A thread-safe pool of world processes (each a py4j gateway that owns a
JVM), and the session that holds one for the length of an episode.

Processes start lazily, at most `limit` of them at once (the run's
`episode.workers`, read when the pool is first used); a thread that finds
them all busy waits for one to be given back. `close()` stops the idle ones
(and busy ones as they come back); every pool is closed at interpreter exit.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from skillstate.envs.episode import Session


@dataclass(eq=False)
class Worker:
    """One world process: the package's env object and what it has loaded
    (so a process asked for the same game again can skip reloading it)."""

    env: Any
    loaded: Any = None

    def close(self) -> None:
        try:
            self.env.close()  # shuts the gateway and asks the JVM to exit
        finally:
            # Wait for the JVM, so the package's own __del__ (a second close) finds it gone
            # instead of writing to its closed stdin.
            proc = getattr(getattr(self.env, "_gateway", None), "java_process", None)
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except Exception:
                    proc.kill()
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        try:
                            pipe.close()
                        except OSError:
                            pass
            # the packages' scratch files for object trees (TWX a file, ScienceWorld a directory)
            for name in ("_obj_tree_tempfile", "_obj_tree_tempdir"):
                scratch = getattr(self.env, name, None)
                done = getattr(scratch, "cleanup", None) or getattr(scratch, "close", None)
                if done is not None:
                    try:
                        done()
                    except OSError:
                        pass


class ProcessPool:
    """At most `limit()` processes made by `start()`; `acquire` lends one,
    `release` takes it back (`discard=True` stops it: a process that failed)."""

    def __init__(self, start: Callable[[], Worker], limit: Callable[[], int], name: str = "world"):
        self.name = name
        self._start = start
        self._limit_of = limit
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._busy: dict[int, Worker] = {}
        self._generation: dict[int, int] = {}  # id(worker) -> the pool generation it was started in
        self._current = 0  # bumped by close(): workers from before it are stopped when given back
        self._starting = 0
        self._stopping = 0
        self._limit: int | None = None
        self.started = 0  # processes started so far
        self.peak = 0  # the most processes alive at once
        _POOLS.add(self)

    @property
    def limit(self) -> int:
        with self._cond:
            if self._limit is None:
                self._limit = max(1, int(self._limit_of()))
            return self._limit

    def alive(self) -> int:
        """Processes alive now: idle, lent out, starting or stopping."""
        with self._cond:
            return self._alive()

    def _alive(self) -> int:
        return len(self._idle) + len(self._busy) + self._starting + self._stopping

    def acquire(self) -> Worker:
        limit = self.limit
        with self._cond:
            while True:
                if self._idle:
                    worker = self._idle.pop()
                    self._busy[id(worker)] = worker
                    return worker
                if self._alive() < limit:
                    self._starting += 1
                    self.peak = max(self.peak, self._alive())
                    generation = self._current
                    break
                self._cond.wait()
        try:
            worker = self._start()
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            self._busy[id(worker)] = worker
            self._generation[id(worker)] = generation
            self.started += 1
        return worker

    def release(self, worker: Worker, *, discard: bool = False) -> None:
        with self._cond:
            if self._busy.pop(id(worker), None) is None:
                return  # not lent out by this pool (given back twice)
            stop = discard or self._generation.get(id(worker)) != self._current
            if stop:
                self._generation.pop(id(worker), None)
                self._stopping += 1
            else:
                self._idle.append(worker)
                self._cond.notify()
        if stop:
            self._stop(worker)

    @contextmanager
    def lease(self) -> Iterator[Worker]:
        """A process for the length of the block; one the block failed with is stopped."""
        worker = self.acquire()
        ok = False
        try:
            yield worker
            ok = True
        finally:
            self.release(worker, discard=not ok)

    def close(self) -> None:
        """Stop the idle processes; those lent out are stopped when given back."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._current += 1
            for worker in idle:
                self._generation.pop(id(worker), None)
            self._stopping += len(idle)
        for worker in idle:
            self._stop(worker)

    def _stop(self, worker: Worker) -> None:
        try:
            worker.close()
        except Exception:  # a process that is already gone
            pass
        finally:
            with self._cond:
                self._stopping -= 1
                self._cond.notify()

    def _close_at_exit(self) -> None:
        self.close()
        with self._cond:
            busy = list(self._busy.values())
        for worker in busy:  # threads still playing at exit lose their process
            try:
                worker.close()
            except Exception:
                pass


_POOLS: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool._close_at_exit()


class PooledSession(Session):
    """A session that holds a pooled process until `close()`. A subclass
    sets `broken` when the process failed, so it is stopped, not reused."""

    def __init__(self, pool: ProcessPool, worker: Worker):
        self.pool, self.worker = pool, worker
        self.broken = False
        self.finished = False  # the world ended the episode
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.pool.release(self.worker, discard=self.broken)
