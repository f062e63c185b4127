"""Verifying a run whose target is an external agent: its rollouts are checked, not re-run.

An agent CLI's requests are not reproducible byte for byte, so `replay --verify` cannot re-execute its
rollouts against the journal. For such an environment (one whose `replays_agent` is False) verification
takes each rollout from the log instead: the result the run's events hold for that skill, item and
sample, whose trajectory the environment checks (`check_recorded`: for a workspace task, the check run
again on the recorded final workspace, the diff and the calls made). Everything after the rollouts
(the analysts, the merge, the gate) is re-executed from the journal as for any run.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from typing import Any

from skillstate.engine.context import RunContext
from skillstate.envs.base import RolloutOutcome
from skillstate.errors import EnvFailure
from skillstate.llm.base import CallResult
from skillstate.log.events import ItemResult


def recorded_results(ctx: RunContext) -> dict[tuple[str, str, int | None], list[ItemResult]]:
    """(skill blob, item id, sample) -> the results the run's lineage holds for it, in log order."""
    from skillstate.engine.loading import load_run

    out: dict[tuple[str, str, int | None], list[ItemResult]] = defaultdict(list)
    for stored in load_run(ctx.store, ctx.run_id).lineage:
        for skill, results in _rolled_out(stored.event):
            if isinstance(results, str):  # a blob: the JSON list of results
                results = [ItemResult.model_validate(r) for r in json.loads(ctx.store.get_blob(results))]
            for r in results:
                out[(skill, r.item_id, r.sample)].append(r)
    return out


def _rolled_out(event: Any) -> list[tuple[str, Any]]:
    """(skill blob, its results) of every rollout set an event holds: its own, and those of the parts it
    lists (the screen's tried edits, the repair's and the search's ablations, the search's group)."""
    parts = [event]
    for name in type(event).model_fields:
        value = getattr(event, name)
        parts += value if isinstance(value, list) else [value]
    return [(skill, results) for part in parts
            if isinstance(skill := getattr(part, "skill", None), str)
            and (results := getattr(part, "results", None)) is not None]


class RecordedExecutor:
    """Rollouts taken from the log and checked by the environment (verification of external agents)."""

    def __init__(self, ctx: RunContext):
        self._results = recorded_results(ctx)
        self._lock = threading.Lock()

    def rollout(self, ctx: RunContext, skill: str, item: dict[str, Any], sample: int | None) -> RolloutOutcome:
        key = (ctx.put_skill(skill), item["id"], sample)  # the skill's hash as the events name it
        with self._lock:
            found = self._results.get(key) or []
            result = found.pop(0) if found else None
        if result is None:
            raise EnvFailure(f"the log holds no rollout of item {item['id']!r} with this skill to check")
        trajectory = json.loads(ctx.store.get_blob(result.trajectory)) if result.trajectory else None
        problem = ctx.env.check_recorded(item, trajectory, result, ctx.store.get_blob)
        if problem:
            raise EnvFailure(f"the recorded rollout of item {item['id']!r} does not hold: {problem}")
        return RolloutOutcome(hard=result.hard, soft=result.soft, fail_reason=result.fail_reason,
                              prediction=result.prediction, task_type=result.task_type, trajectory=trajectory,
                              calls=[CallResult(ref=c) for c in result.calls], turns=result.turns, seed=result.seed,
                              skills_loaded=list(result.skills_loaded), files_read=list(result.files_read))

    def close(self) -> None:
        pass
