"""The circuit breaker: counts the calls a run makes and stops it when too
many fail, so a dead or misbehaving endpoint never yields a run that merely
looks finished.

Three rules; the numbers are config keys (runtime keys: a resume may change
them):
- `max_consecutive_failures` failed calls in a row stop the run at once,
  without waiting for the rest of the stage. The row is the endpoint's: it
  counts the calls in the order they complete, across stages and across
  the lanes (the stage under way and the work done ahead of it); a call
  that succeeds breaks it, and so does one served from the call table (a
  stage is served what work done ahead got, and sends again only what
  failed there: its sent calls alone would look like a dead endpoint);
- at the end of a stage, more than `max_stage_failure_share` of the stage's
  calls (sent or served) failed, once it sent at least 4;
- at the end of a stage, more than that share of one role's calls failed
  since this driver started, once at least 2 of them failed: so an endpoint
  that only ever fails is caught at its first stage even when each stage
  sends it just one or two calls (an optimizer behind a dead server).
A stopped stage is not appended, so a resume redoes it: the calls that
succeeded are served from the call table and only the failed ones are sent
again. A fatal error (`FatalLLMError`) opens the breaker too, so no other
thread sends anything once one call has hit it.
"""

from __future__ import annotations

import threading
from collections import Counter

from skillstate.llm.base import CircuitOpen

# A stage's failure share is judged only from this many sent calls on,
# a role's only from this many failures on.
MIN_STAGE_CALLS = 4
MIN_ROLE_FAILURES = 2


class CallHealth:
    def __init__(self, max_consecutive: int = 16, max_share: float = 0.5):
        self.max_consecutive = max_consecutive
        self.max_share = max_share
        self._lock = threading.Lock()
        self.consecutive = 0
        self.stage = ""
        self.sent = 0
        self.calls = 0  # of the stage: sent and served
        self.errors: Counter[str] = Counter()  # of the stage: "role: error" -> count
        self.role_calls: Counter[str] = Counter()  # since this driver started: sent and served
        self.role_failed: Counter[str] = Counter()
        self.stopped: BaseException | None = None

    def begin_stage(self, name: str) -> None:
        with self._lock:
            self.stage, self.sent, self.calls, self.errors = name, 0, 0, Counter()

    def check(self) -> None:
        """Raise the error that stopped the run, if one did: nothing more is sent."""
        if self.stopped is not None:
            raise self.stopped

    def trip(self, err: BaseException) -> None:
        with self._lock:
            if self.stopped is None:
                self.stopped = err

    def served(self, role: str) -> None:
        """Count one call answered from the call table: a call that did not fail."""
        with self._lock:
            self.calls += 1
            self.role_calls[role] += 1
            self.consecutive = 0

    def record(self, role: str, error: str | None) -> None:
        """Count one sent call; raises CircuitOpen when the consecutive rule trips."""
        with self._lock:
            self.sent += 1
            self.calls += 1
            self.role_calls[role] += 1
            if error is not None:
                self.role_failed[role] += 1
                self.errors[f"{role}: {error}"] += 1
        self.in_a_row(role, error)

    def in_a_row(self, role: str, error: str | None) -> None:
        """The consecutive rule alone: raises CircuitOpen when it trips."""
        with self._lock:
            if error is None:
                self.consecutive = 0
                return
            self.consecutive += 1
            if self.max_consecutive and self.consecutive >= self.max_consecutive and self.stopped is None:
                self.stopped = CircuitOpen(
                    f"{self.consecutive} LLM calls in a row failed (max_consecutive_failures="
                    f"{self.max_consecutive}) in stage {self.stage}; the last: {role}: {error}")
        self.check()

    def end_stage(self) -> None:
        """Raise CircuitOpen when too many of the stage's, or of one role's, calls failed."""
        if self.max_share >= 1.0 or not self.errors:
            return
        common, count = self.errors.most_common(1)[0]
        rule = f"more than max_stage_failure_share={self.max_share:g}; most common ({count}x): {common}"
        failed = sum(self.errors.values())
        if self.sent >= MIN_STAGE_CALLS and failed > self.max_share * self.calls:
            raise CircuitOpen(f"{failed} of the {self.calls} LLM calls of stage {self.stage} failed ({rule})")
        for role, n in self.role_failed.items():
            if n >= MIN_ROLE_FAILURES and n > self.max_share * self.role_calls[role]:
                raise CircuitOpen(f"{n} of the {self.role_calls[role]} {role} calls so far failed, by the end of "
                                  f"stage {self.stage} ({rule})")


class AheadHealth(CallHealth):
    """The counts of the work done ahead of time (`skillstate.engine.ahead`):
    its failures never count toward a stage's share rules, but its sent calls
    are in the run's row of calls in a row, failed or not (an endpoint that
    fails, fails for both lanes; the row outlives a stage), it sends nothing once the run's breaker is open, and a fatal
    error it meets opens the run's breaker too."""

    def __init__(self, run: CallHealth):
        super().__init__(0, 1.0)
        self.run = run

    def record(self, role: str, error: str | None) -> None:
        super().record(role, error)
        self.run.in_a_row(role, error)

    def check(self) -> None:
        self.run.check()
        super().check()

    def trip(self, err: BaseException) -> None:
        super().trip(err)
        self.run.trip(err)
