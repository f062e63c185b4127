"""A run's learning curves, folded from its log: what the dashboard, `plot`
and `export-mlflow` draw. Nothing here calls an LLM or writes.

Per step: the edit budget, the decision and its reason, the candidate's gate
score (or, when it was rejected early, the bound that proved the reject), the
current and best scores after the step, and what the step's calls cost at
list prices (its own, and the run's cumulative cost after it, a fork's
inherited steps included). These are the costs of the events, whether their
calls were sent or served from the log. Also the
baseline, the test reports and the epoch-end slow updates.
"""

from __future__ import annotations

from typing import Any

from skillstate.config import SIM_MODELS
from skillstate.engine.loading import LoadedRun
from skillstate.log.events import CandidateEvaluated, Event, GateDecided, StepStarted
from skillstate.log.events_epoch import SlowUpdateDecided
from skillstate.log.reducer import RunState, stage_of
from skillstate.pricing import cost_usd, price_for


def _pricer(state: RunState):
    config = state.config
    prices = config.get("prices") or {}
    models = {role: (config.get(role) or {}).get("model") or SIM_MODELS.get(role, "") for role in SIM_MODELS}

    def cost(event: Event) -> tuple[float, int]:
        usd, calls = 0.0, 0
        for role, u in event.usage().items():
            usd += cost_usd(u.prompt_tokens, u.completion_tokens, price_for(models.get(role, ""), prices))
            calls += u.calls
        return usd, calls

    return cost


def _scores(scores) -> dict[str, Any]:
    return {"gate": scores.gate, "hard": scores.hard, "soft": scores.soft, "n": scores.n}


def run_curves(loaded: LoadedRun) -> dict[str, Any]:
    """The curves of a run (a fork's include the steps it inherited, marked
    `inherited`)."""
    state = loaded.state
    price = _pricer(state)
    fork_step = state.fork_step or 0
    steps: dict[int, dict[str, Any]] = {}
    slow: list[dict[str, Any]] = []
    total_usd, total_calls, own_usd, own_calls = 0.0, 0, 0.0, 0
    own_by_stage: dict[str, float] = {}
    for stored in loaded.lineage:
        ev = stored.event
        usd, calls = price(ev)
        total_usd += usd
        total_calls += calls
        if stored.run_id == loaded.run_id:
            own_usd += usd
            own_calls += calls
            if calls:
                own_by_stage[stage_of(ev)] = own_by_stage.get(stage_of(ev), 0.0) + usd
        step = getattr(ev, "step", None)
        if isinstance(ev, StepStarted):
            steps[ev.step] = {"step": ev.step, "epoch": ev.epoch, "edit_budget": ev.edit_budget,
                              "items": len(ev.batch_item_ids), "decision": None, "reason": "",
                              "candidate_score": None, "early_reject_bound": None, "scored": None,
                              "current_score": None, "best_score": None, "cost_usd": 0.0, "calls": 0,
                              "inherited": stored.run_id != loaded.run_id}
        if step is not None and step in steps:
            row = steps[step]
            row["cost_usd"] += usd
            row["calls"] += calls
            row["cumulative_cost_usd"] = total_usd
            row["cumulative_calls"] = total_calls
            if isinstance(ev, CandidateEvaluated):  # the gated one: after a repair, the repaired candidate's
                row["early_reject_bound"] = ev.partial.upper_bound if ev.partial is not None else None
                row["scored"] = [ev.partial.scored, ev.partial.of] if ev.partial is not None else None
            if isinstance(ev, GateDecided):
                row.update(decision=ev.decision, reason=ev.reason, candidate_score=ev.candidate_score)
        if isinstance(ev, SlowUpdateDecided):
            slow.append({"epoch": ev.epoch, "decision": ev.decision, "candidate_score": ev.candidate_score,
                         "after_step": state.steps_per_epoch * ev.epoch, "reason": ev.reason,
                         "early_reject_bound": ev.partial.upper_bound if ev.partial else None})
    for rec in state.history:
        if rec.step in steps:
            steps[rec.step].update(current_score=rec.current_score, best_score=rec.best_score)
    for row in steps.values():
        row["cost_usd"] = round(row["cost_usd"], 6)
        row["cumulative_cost_usd"] = round(row.get("cumulative_cost_usd", 0.0), 6)
        row.setdefault("cumulative_calls", 0)
        if fork_step and row["step"] <= fork_step:
            row["inherited"] = True
    tests = {label: {"split": ev.split, **_scores(ev.scores),
                     "by_task_type": {k: v.model_dump() for k, v in ev.scores.by_task_type.items()}}
             for label, ev in state.tests.items()}
    return {
        "run_id": loaded.run_id,
        "kind": state.kind,
        "parent_run_id": state.parent_run_id,
        "fork_step": state.fork_step,
        "gate_metric": state.config.get("gate_metric"),
        "mode": state.config.get("mode", "skill"),
        "total_steps": state.total_steps,
        "steps_per_epoch": state.steps_per_epoch,
        "baseline": _scores(state.baseline) if state.baseline else None,
        "steps": [steps[k] for k in sorted(steps)],
        "slow_updates": slow,
        "tests": tests,
        "best_score": state.best_score,
        "best_step": state.best_step,
        "cost_usd": round(total_usd, 6),  # with a fork's inherited steps
        "calls": total_calls,
        "own_cost_usd": round(own_usd, 6),  # the run's own events (a fork's without its parent's)
        "own_calls": own_calls,
        "own_cost_by_stage": {stage: round(usd, 6) for stage, usd in own_by_stage.items()},
    }
