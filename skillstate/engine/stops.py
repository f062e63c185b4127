"""Stop conditions (config keys `stop_after_no_improvement`, `target_score`,
`max_wall_seconds`, `stop_file`), checked by the driver at event boundaries.

A condition that holds becomes a `StopConditionMet` event and the driver
returns: the run is saved and resumes where it stopped once the condition
is relaxed (they are runtime keys). The score conditions are checked only
before a step starts; the wall time and the stop file before any stage."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from skillstate.config import SkillConfig
from skillstate.log.events import Event, StopConditionMet
from skillstate.log.state import RunState

# A stop to append before the stage (verification passes every recorded input there: a review's decision too).
StopCheck = Callable[[RunState, str], StopConditionMet | Event | None]


class StopConditions:
    """The conditions of `config`, with the wall clock started now."""

    def __init__(self, config: SkillConfig, clock: Callable[[], float] = time.monotonic):
        self.config, self.clock = config, clock
        self.started = clock()

    def __call__(self, state: RunState, stage: str) -> StopConditionMet | None:
        if state.kind != "train":
            return None
        found = self.found(state, stage)
        if found is None:
            return None
        condition, reason = found
        return StopConditionMet(condition=condition, reason=reason, step=state.last_completed_step)

    def found(self, state: RunState, stage: str) -> tuple[str, str] | None:
        cfg = self.config
        if cfg.stop_file and os.path.exists(cfg.stop_file):
            return "stop_file", f"the stop file {cfg.stop_file} exists"
        if cfg.max_wall_seconds is not None and (elapsed := self.clock() - self.started) >= cfg.max_wall_seconds:
            return "wall_time", f"ran {elapsed:.0f} s, the limit is max_wall_seconds={cfg.max_wall_seconds:g}"
        if stage != "start_step" or state.best_score is None:
            return None
        if cfg.target_score is not None and state.best_score >= cfg.target_score:
            return "target_score", f"the best score {state.best_score:.4f} reached target_score={cfg.target_score:g}"
        patience = cfg.stop_after_no_improvement
        since = state.last_completed_step - max(state.best_step, state.fork_step or 0)
        if patience is not None and since >= patience:
            return ("no_improvement", f"the best score {state.best_score:.4f} (step {state.best_step}) has not "
                                      f"improved for {since} steps (stop_after_no_improvement={patience})")
        return None


def already_stopped(state: RunState, stop: Event) -> bool:
    """The log already ends with this stop: resuming under the same condition adds nothing."""
    last = state.stopped
    return (isinstance(stop, StopConditionMet) and last is not None
            and (last.condition, last.step) == (stop.condition, stop.step))
