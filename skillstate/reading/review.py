"""What a reviewer reads (`review`): the step a run waits on, or a step reviewed before, as one dict that
`skillstate review` prints and the dashboard's review page draws: the diff per file, the scores (per task
type too), the gate's verdict, each edit the candidate applies with the analysts and failures behind it (as
`skillstate why` shows them), what the step and the run cost, and the decision once there is one.
(Deciding is `skillstate.engine.review_desk.decide`: this module only reads.)"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from skillstate.engine.loading import LoadedRun, load_run, roles_of
from skillstate.engine.review_desk import waiting
from skillstate.errors import NotFoundError, UserError
from skillstate.log.events import Edit, PatchProposed, RolloutCompleted
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.log.reducer import usage_totals
from skillstate.reading.history import cost_summary
from skillstate.skillopt.review import numbered
from skillstate.storage.store import Store, StoredEvent


def _touches(a: Edit, b: Edit) -> bool:
    """Two edits that say the same thing (one may be the other without a clause, or merged from it)."""
    x, y = a.content.strip(), b.content.strip()
    if not x or not y:
        return a.op == b.op and a.target.strip() == b.target.strip() and bool(a.target.strip())
    return x in y or y in x


def _when(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).isoformat(timespec="seconds")


def proposed_by(edit: Edit, patches: list[PatchProposed], rollout: RolloutCompleted | None) -> list[dict[str, Any]]:
    """The analysts whose patch holds `edit`, with the items they were shown (`why`'s "proposed by")."""
    results = {r.item_id: r for r in rollout.results} if rollout is not None else {}
    out = []
    for patch in patches:
        matching = [e for e in patch.edits if _touches(e, edit)]
        if not matching:
            continue
        out.append({
            "source": patch.source, "minibatch": patch.minibatch, "reasoning": patch.reasoning,
            "failure_summary": patch.failure_summary,
            "edits": [{"op": e.op, "target": e.target, "content": e.content} for e in matching],
            "items": [{"item_id": i, "task_type": results[i].task_type, "hard": results[i].hard,
                       "fail_reason": results[i].fail_reason} for i in patch.item_ids if i in results],
        })
    return out


def _blocker(events: list[Any]) -> dict[str, Any] | None:
    """The blocker search's finding, when the step has one (blocker_search): the line and the items it held."""
    found = next((e for e in events if e.type == "BlockerSearched" and getattr(e, "found", None) is not None), None)
    if found is None:
        return None
    ablation = found.ablations[found.found]
    return {"line": ablation.line, "task_type": found.task_type, "items": len(found.item_ids),
            "lifted": ablation.lifted, "reason": found.reason}


def find(loaded: LoadedRun, step: int | None) -> tuple[StoredEvent, StoredEvent | None]:
    """The stored request of `step` (default: the one the run waits on) and its decision, if any."""
    requests = [s for s in loaded.lineage if s.type == ReviewRequested.type and (step is None or s.step == step)]
    if not requests:
        if step is None:
            raise UserError(f"run {loaded.run_id} has no review: it runs with review: "
                            f"{loaded.state.config.get('review', 'off')}")
        raise NotFoundError(f"step {step} of run {loaded.run_id} was not reviewed")
    request = requests[-1]
    decided = next((s for s in loaded.lineage[loaded.lineage.index(request):] if s.type == ReviewDecided.type
                    and s.step == request.step), None)
    return request, decided


def review_view(store: Store, run_id: str | None, step: int | None = None,
                loaded: LoadedRun | None = None) -> dict[str, Any]:
    """The review of `step` in run `run_id` (default: the step the run waits on; a run that waits on none
    is refused, in one line)."""
    loaded = loaded or load_run(store, run_id)
    if step is None:
        waiting(store, loaded.run_id, loaded)  # UserError: not waiting (saying where the run stands)
    stored, decided_at = find(loaded, step)
    req = stored.event
    assert isinstance(req, ReviewRequested)
    state = loaded.state
    events = [s.event for s in loaded.lineage if s.step == req.step]
    patches = [e for e in events if isinstance(e, PatchProposed)]
    rollout = next((e for e in events if isinstance(e, RolloutCompleted)), None)
    blocker = _blocker(events)
    edits = []
    for number, row in enumerate(req.edits, start=1):
        e = row.edit
        edits.append({"number": number, "op": e.op, "target": e.target, "content": e.content, "file": e.file,
                      "source": e.source, "support": e.support, "origin": row.origin, "index": row.index,
                      "status": row.status,
                      "proposed_by": proposed_by(e, patches, rollout) if row.origin != "blocker" else [],
                      **({"blocker": blocker} if row.origin == "blocker" and blocker else {})})
    config = dict(state.config)
    roles = roles_of(state.kind, str(state.config.get("env", "qa")))
    upto = loaded.lineage[: loaded.lineage.index(stored) + 1]
    step_cost = cost_summary([], config, usage_totals(s.event for s in upto if s.step == req.step), roles)
    run_cost = cost_summary(store.paid_by_model(loaded.run_id), config,
                            usage_totals(s.event for s in loaded.own), roles)
    decision = None
    if decided_at is not None:
        d = decided_at.event
        assert isinstance(d, ReviewDecided)
        decision = {"decision": d.decision, "dropped": [i + 1 for i in d.dropped], "reviewer": d.reviewer,
                    "at": d.at, "comment": d.comment, "seq": decided_at.seq,
                    "text": f"{d.decision}{' without edit ' + numbered(d.dropped) if d.dropped else ''} by "
                            f"{d.reviewer}"}
    v = req.verdict
    return {
        "run_id": loaded.run_id,
        "step": req.step,
        "review": req.review,
        "waiting": decision is None,
        "requested_at": _when(stored.created_at),
        "seq": stored.seq,
        "candidate": req.candidate,
        "base_skill": req.base_skill,
        "verdict": {"decision": v.decision, "reason": v.reason, "candidate_score": v.candidate_score,
                    "current_score": v.current_score, "best_score": v.best_score, "rule": v.rule,
                    "paired": v.paired.model_dump() if v.paired else None,
                    "type_guard": v.type_guard.model_dump() if v.type_guard else None},
        "split": req.split,
        "scores": {"hard": req.scores.hard, "soft": req.scores.soft, "gate": req.scores.gate, "n": req.scores.n},
        "partial": req.partial.model_dump(exclude={"item_ids"}) if req.partial else None,
        "current_scores": ({"hard": req.current_scores.hard, "soft": req.current_scores.soft,
                            "gate": req.current_scores.gate, "n": req.current_scores.n}
                           if req.current_scores else None),
        "types": [t.model_dump() for t in req.types],
        "files": json.loads(store.get_blob(req.diff)),
        "edits": edits,
        "droppable": req.droppable and v.decision in ("accept", "accept_best"),
        "cost": {"step": step_cost["total"], "run": run_cost["total"], "paid": run_cost["paid"],
                 "unpriced_models": run_cost["unpriced_models"]},
        "timeout": ({"seconds": config.get("review_timeout"), "default": config.get("review_default")}
                    if config.get("review_timeout") is not None else None),
        "decision": decision,
    }


def review_line(event: ReviewRequested | ReviewDecided) -> str:
    """One line for a review event (`skillstate log`, a run's progress)."""
    if isinstance(event, ReviewRequested):
        v = event.verdict
        return (f"step {event.step} awaits review (review: {event.review}; the gate: {v.decision}, {v.reason}; "
                f"{len(event.edits)} edits)")
    without = f" without edit {numbered(event.dropped)}" if event.dropped else ""
    note = f": {event.comment}" if event.comment and event.reviewer != "timeout" else ""
    return f"step {event.step}: {event.decision}{without} by {event.reviewer}{note}"
