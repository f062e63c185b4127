"""Step 0 of a run, as one dict: the baseline (the initial skill scored on
the selection split) and, for a bank run seeded from imported trajectories
(`bank.trajectories`), the seeding that came before it. `skillstate show
--step 0` prints it."""

from __future__ import annotations

import json
from typing import Any

from skillstate.engine.loading import LoadedRun
from skillstate.errors import NotFoundError
from skillstate.log.events import BaselineEvaluated, RunStarted
from skillstate.log.events_bank import BankSeeded
from skillstate.reading.failures import event_call_refs, failed_calls
from skillstate.storage.store import Store


def _skill(skill) -> dict[str, Any]:
    return {"id": skill.id, "title": skill.title, "principle": skill.principle, "category": skill.category}


def step_zero(store: Store, loaded: LoadedRun) -> dict[str, Any]:
    """What the log says before step 1. `NotFoundError` when the run has no baseline yet."""
    stored = [s for s in loaded.lineage if s.step is None and s.type != RunStarted.type]
    baseline = next((s.event for s in stored if isinstance(s.event, BaselineEvaluated)), None)
    if baseline is None:
        raise NotFoundError(f"step 0 is beyond the end of run {loaded.run_id!r} (no baseline yet)")
    out: dict[str, Any] = {"run_id": loaded.run_id, "step": 0,
                           "failed_calls": failed_calls(list(event_call_refs(store, stored)))}
    for s in stored:
        ev = s.event
        if isinstance(ev, BankSeeded):
            imported = loaded.state.trajectories
            out["seeded"] = {
                "trajectories": len(json.loads(store.get_blob(imported))) if imported else 0,
                "statuses": ev.statuses, "added": [_skill(x) for x in ev.added],
                "dropped": [{"reason": x.reason, "similar_to": x.similar_to, **_skill(x.skill)} for x in ev.dropped],
                "mistakes": [m.model_dump(mode="json") for m in ev.mistakes]}
        elif isinstance(ev, BaselineEvaluated):
            results = [json.loads(store.get_blob(ev.results))] if ev.results else [[]]
            out["baseline"] = {
                "split": ev.split, "skill": ev.skill, "hard": ev.scores.hard, "soft": ev.scores.soft,
                "gate": ev.scores.gate, "items": ev.scores.n,
                "by_task_type": {t: v.hard for t, v in ev.scores.by_task_type.items()},
                "failures": [{"item_id": r["item_id"], "task_type": r.get("task_type", ""),
                              "fail_reason": r.get("fail_reason", "")} for r in results[0] if r["hard"] < 1]}
    return out
