"""Why is this sentence in the skill? Trace a text through the log: the step
that added it, the kept edit, the analysts who proposed it and the failures
they were looking at; and every later step that removed or re-added it."""

from __future__ import annotations

from typing import Any

from skillstate.engine.runner import load_run
from skillstate.errors import UserError
from skillstate.events import Edit, PatchProposed, RolloutCompleted
from skillstate.gate import ACCEPTED
from skillstate.store import Store


def _touches(edit: Edit, text: str) -> bool:
    return bool(edit.content) and (text in edit.content or edit.content.strip() in text)


def explain(store: Store, run_id: str | None, text: str) -> dict[str, Any]:
    text = text.strip()
    if not text:
        raise UserError("give the text to look for, e.g. skillstate why \"order of operations\"")
    loaded = load_run(store, run_id)
    state = loaded.state
    initial = store.get_blob(state.initial_skill)
    changes: list[dict[str, Any]] = []
    step_events: dict[int, list] = {}
    for s in loaded.lineage:
        ev = s.event
        step = getattr(ev, "step", None)
        if step is not None:
            step_events.setdefault(step, []).append(ev)
    present = text in initial
    for rec in state.history:
        if rec.decision not in ACCEPTED:
            continue
        now = text in store.get_blob(rec.current_skill)
        if now != present:
            changes.append({"step": rec.step, "epoch": rec.epoch, "change": "added" if now else "removed",
                            "decision": rec.decision, "reason": rec.reason})
            present = now
    origin: dict[str, Any] | None = None
    if present and changes:
        origin = _origin(step_events[changes[-1]["step"]], text)
    return {
        "run_id": loaded.run_id,
        "text": text,
        "in_initial_skill": text in initial,
        "in_current_skill": text in store.get_blob(state.current_skill),
        "in_best_skill": text in store.get_blob(state.best_skill),
        "changes": changes,
        "origin": origin,
    }


def _origin(events: list, text: str) -> dict[str, Any]:
    """The kept edits of the step that added `text`, and who proposed them."""
    by_type = {ev.type: ev for ev in events}
    selected = by_type["EditsSelected"]
    report = by_type["CandidateBuilt"].report
    rollout: RolloutCompleted = by_type["RolloutCompleted"]
    results = {r.item_id: r for r in rollout.results}
    kept = [(i, e) for i, e in enumerate(selected.edits) if _touches(e, text)]
    patches: list[PatchProposed] = [ev for ev in events if ev.type == "PatchProposed"]
    proposals = []
    for patch in patches:
        matching = [e for e in patch.edits if any(e.content == k.content for _, k in kept) or _touches(e, text)]
        if not matching:
            continue
        proposals.append({
            "source": patch.source, "minibatch": patch.minibatch, "reasoning": patch.reasoning,
            "failure_summary": patch.failure_summary,
            "edits": [{"op": e.op, "target": e.target, "content": e.content} for e in matching],
            "items": [{"item_id": i, "task_type": results[i].task_type, "hard": results[i].hard,
                       "fail_reason": results[i].fail_reason} for i in patch.item_ids if i in results],
        })
    return {
        "step": selected.step,
        "kept_edits": [{"op": e.op, "target": e.target, "content": e.content, "source": e.source,
                        "support": e.support, "status": report[i].status if i < len(report) else None}
                       for i, e in kept],
        "proposed_by": proposals,
    }
