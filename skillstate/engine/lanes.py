"""Lanes of work under one concurrency cap: the foreground (the stage under
way, whose results become events) and two background lanes for work done
ahead of time, whose only trace is the call table: `certain` work (needed
later whatever happens) and `speculative` work (needed only if the gate
rejects).

At most `cap` tasks run at once across the lanes. A foreground task waiting
for a slot always goes before background work, and speculative work also
waits while the stage under way is in a burst (a rollout or an evaluation
that can fill the cap by itself), so it only takes slots the foreground
leaves idle for a while (the reflect, merge and rank stages), never the
moment between one item finishing and the next being sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

FOREGROUND, CERTAIN, SPECULATIVE = "foreground", "certain", "speculative"


class Slots:
    def __init__(self, cap: int):
        self.cap = cap
        self.busy = 0
        self.foreground_waiting = 0
        self.bursts = 0
        self._cond = threading.Condition()

    def _blocked(self, lane: str) -> bool:
        if self.busy >= self.cap:
            return True
        if lane == FOREGROUND:
            return False
        return self.foreground_waiting > 0 or (lane == SPECULATIVE and self.bursts > 0)

    @contextmanager
    def hold(self, lane: str) -> Iterator[None]:
        with self._cond:
            if lane == FOREGROUND:
                self.foreground_waiting += 1
            try:
                while self._blocked(lane):
                    self._cond.wait()
            finally:
                if lane == FOREGROUND:
                    self.foreground_waiting -= 1
            self.busy += 1
        try:
            yield
        finally:
            with self._cond:
                self.busy -= 1
                self._cond.notify_all()

    @contextmanager
    def burst(self) -> Iterator[None]:
        """While the foreground sends more work than the cap holds: no speculative work starts."""
        with self._cond:
            self.bursts += 1
        try:
            yield
        finally:
            with self._cond:
                self.bursts -= 1
                self._cond.notify_all()
