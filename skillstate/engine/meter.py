"""Counting a stage's LLM calls as they complete, for live progress.

The meter only counts: it never touches a request, a reply, an event or the
call table, so a run's log is the same with a progress callback or without.
It reports a `CallProgress` through `emit` (the run context wraps it in a
`Progress` of kind "calls"):
- when a stage says how many calls it plans (`expect`), at once;
- as calls complete, at most once per `interval` seconds (calls complete on
  worker threads: a report may come from any of them, never two at a time,
  and never one older than a report already made);
- once more when the stage ends (`finish`, with `final` set), on the thread
  that drives the run.
Calls done ahead in the background lanes count apart (`ahead`), never into
the bar of the stage under way, and they trigger no report of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CallProgress:
    """The LLM calls of the stage under way, and of the run so far."""

    stage: str
    planned: int | None  # calls the stage plans, where the engine knows; None: a count without a total
    done: int  # calls completed in this stage (served + sent; failed ones included)
    served: int  # of those, served from the call table (the log): not sent again
    sent: int  # of those, sent to the backend
    failed: int  # of those, failed (an error, a timeout, an unusable reply)
    ahead: int  # calls done ahead in the background lanes meanwhile (not in `done`)
    run_calls: int  # every call this process made for the run so far, foreground and ahead
    cost_usd: float | None  # what the run's sent requests cost so far (earlier invocations too); None: not counted
    max_cost_usd: float | None  # the run's budget, if it has one
    final: bool = False  # the stage's last report


class CallMeter:
    def __init__(self, emit: Callable[[CallProgress], None] | None, cost: Callable[[], tuple[float, float | None]]
                 | None = None, interval: float = 0.1):
        self.emit = emit
        self.cost = cost  # () -> (spent, limit)
        self.interval = interval
        self._lock = threading.Lock()
        self._emit_lock = threading.Lock()
        self._stage: str | None = None
        self._planned: int | None = None
        self._done = self._served = self._sent = self._failed = 0
        self._ahead = self._run_calls = 0
        self._last = 0.0  # monotonic time of the last report
        self._version = self._emitted = 0  # snapshots taken, and the newest reported

    @property
    def stage(self) -> str | None:
        return self._stage

    def begin(self, stage: str) -> None:
        """A new stage: its counts start at zero (the previous stage's final report is made first)."""
        self.finish()
        with self._lock:
            self._stage, self._planned = stage, None
            self._done = self._served = self._sent = self._failed = 0

    def expect(self, calls: int) -> None:
        """The stage plans `calls` more calls."""
        if self._stage is None:
            return
        with self._lock:
            self._planned = (self._planned or 0) + calls
            snap = self._snapshot()
        self._report(snap, quietly=True)

    def record(self, *, served: bool, failed: bool, background: bool) -> None:
        """One call completed (on any thread)."""
        snap = None
        with self._lock:
            self._run_calls += 1
            if background or self._stage is None:
                self._ahead += background
                return
            self._done += 1
            self._served += served
            self._sent += not served
            self._failed += failed
            if self.emit is not None and time.monotonic() - self._last >= self.interval:
                snap = self._snapshot()
        if snap is not None:
            self._report(snap, quietly=True)

    def finish(self) -> None:
        """The stage ended: its final report, if it made or planned any call."""
        with self._lock:
            if self._stage is None:
                return
            snap = self._snapshot(final=True) if self._done or self._planned else None
            self._stage = None
        if snap is not None:
            self._report(snap, quietly=False)

    def _snapshot(self, final: bool = False) -> tuple[CallProgress, int]:
        """The counts now, numbered (under the lock); it also marks the time of the report."""
        self._last = time.monotonic()
        self._version += 1
        spent, limit = self.cost() if self.cost is not None else (None, None)
        planned = self._planned if self._planned is None or self._done <= self._planned else None  # a wrong plan
        return CallProgress(stage=self._stage or "", planned=planned, done=self._done, served=self._served,
                            sent=self._sent, failed=self._failed, ahead=self._ahead, run_calls=self._run_calls,
                            cost_usd=spent, max_cost_usd=limit, final=final), self._version

    def _report(self, snap: tuple[CallProgress, int], quietly: bool) -> None:
        progress, version = snap
        if self.emit is None:
            return
        with self._emit_lock:
            if version <= self._emitted:  # a newer report went out while this one waited
                return
            self._emitted = version
            if not quietly:
                self.emit(progress)
                return
            try:
                self.emit(progress)
            except Exception:  # noqa: S110  (a report made inside a call must never change what the call gives)
                pass
