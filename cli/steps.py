"""`skillstate show --step N`: everything the log says about one step."""

from __future__ import annotations

from typing import Any

from skillstate.engine.runner import LoadedRun
from skillstate.errors import NotFoundError
from skillstate.failures import failed_calls
from skillstate.store import Store

from skillstate.cli.render import fmt


def _edit(e) -> dict[str, Any]:
    return {"op": e.op, "target": e.target, "content": e.content, "source": e.source, "support": e.support}


def step_detail(store: Store, loaded: LoadedRun, step: int) -> dict[str, Any]:
    stored = [s for s in loaded.lineage if s.step == step]
    events = [s.event for s in stored]
    if not events:
        raise NotFoundError(f"step {step} is beyond the end of run {loaded.run_id!r} "
                            f"(last completed step: {loaded.state.last_completed_step})")
    out: dict[str, Any] = {"run_id": loaded.run_id, "step": step, "failed_calls": failed_calls(store, stored)}
    for ev in events:
        t = ev.type
        if t == "StepStarted":
            out.update(epoch=ev.epoch, edit_budget=ev.edit_budget, batch=ev.batch_item_ids)
        elif t == "RolloutCompleted":
            out["rollout"] = {
                "solved": sum(1 for r in ev.results if r.hard >= 1), "items": len(ev.results),
                "failures": [{"item_id": r.item_id, "task_type": r.task_type, "fail_reason": r.fail_reason}
                             for r in ev.results if r.hard < 1],
            }
        elif t == "PatchProposed":
            out.setdefault("patches", []).append({
                "source": ev.source, "minibatch": ev.minibatch, "status": ev.status, "items": ev.item_ids,
                "failure_summary": ev.failure_summary, "edits": [_edit(e) for e in ev.edits],
                "raw_reply": store.get_blob(ev.reply) if ev.reply else None,
                "error": ev.call.error if ev.call is not None else None,
            })
        elif t == "PatchesMerged":
            out["merged"] = {"edits": [_edit(e) for e in ev.edits],
                             "merge_calls": [m.model_dump(exclude={"call"}) for m in ev.merges]}
        elif t == "EditsSelected":
            out["selected"] = {"method": ev.method, "budget": ev.budget, "candidates": ev.candidates,
                               "indices": ev.selected_indices, "edits": [_edit(e) for e in ev.edits]}
        elif t == "LearningRateChosen":
            out["learning_rate"] = {"chosen": ev.chosen, "candidates": ev.candidates, "status": ev.status,
                                    "requested": ev.requested, "reasoning": ev.reasoning}
        elif t == "CandidateBuilt":
            out["apply_report"] = [r.model_dump() for r in ev.report]
            out["candidate_changed"] = ev.changed
            out["update"] = {"method": ev.method, "status": ev.status, "block_restored": ev.block_restored}
        elif t == "CandidateEvaluated":
            out["evaluation"] = {"split": ev.split, "hard": ev.scores.hard, "soft": ev.scores.soft,
                                 "gate": ev.scores.gate, "cached": ev.cached}
        elif t == "GateDecided":
            out["decision"] = {"decision": ev.decision, "candidate_score": ev.candidate_score,
                               "current_score_before": ev.current_score, "best_score_before": ev.best_score,
                               "reason": ev.reason}
    return out


def step_text(d: dict[str, Any]) -> str:
    lines = [f"run {d['run_id']} step {d['step']} (epoch {d.get('epoch')}, budget {d.get('edit_budget')}, "
             f"{len(d.get('batch', []))} items)"]
    if "rollout" in d:
        r = d["rollout"]
        lines.append(f"rollout: {r['solved']}/{r['items']} solved")
        for f in r["failures"][:8]:
            lines.append(f"  - {f['item_id']} [{f['task_type']}] {f['fail_reason'][:90]}")
        if len(r["failures"]) > 8:
            lines.append(f"  ... {len(r['failures']) - 8} more failures")
    for p in d.get("patches", []):
        failed = f": {p['error'][:120]}" if p.get("error") else ""
        lines.append(f"patch {p['source']}#{p['minibatch']} ({len(p['items'])} items): {p['status']}{failed}")
        for s in p["failure_summary"]:
            lines.append(f"  pattern: {s}")
        for e in p["edits"]:
            lines.append(f"  {e['op']}: {(e['content'] or e['target'])[:100]}")
    if "merged" in d:
        lines.append(f"merged: {len(d['merged']['edits'])} edits, {len(d['merged']['merge_calls'])} merge calls")
    if "learning_rate" in d:
        lr = d["learning_rate"]
        lines.append(f"learning rate (autonomous): apply {lr['chosen']} of {lr['candidates']} "
                     f"({lr['status']}{', asked ' + lr['requested'] if lr['requested'] else ''})")
    if "selected" in d:
        s = d["selected"]
        lines.append(f"selected ({s['method']}, budget {s['budget']}): {len(s['edits'])} of {s['candidates']}")
        report = d.get("apply_report", [])
        for i, e in enumerate(s["edits"]):
            status = report[i]["status"] if i < len(report) else "kept"
            lines.append(f"  [{status}] {e['op']} ({e['source']}, support {e['support']}): "
                         f"{(e['content'] or e['target'])[:90]}")
    if d.get("update", {}).get("method", "patch") != "patch":
        u = d["update"]
        lines.append(f"update: {u['method']} ({u['status']}), skill {'changed' if d['candidate_changed'] else 'unchanged'}")
    if "evaluation" in d:
        ev = d["evaluation"]
        lines.append(f"candidate on {ev['split']}: hard {fmt(ev['hard'])} soft {fmt(ev['soft'])} gate {fmt(ev['gate'])}"
                     + (" (score cache)" if ev["cached"] else ""))
    if "decision" in d:
        lines.append(f"gate: {d['decision']['decision']} ({d['decision']['reason']})")
    f = d.get("failed_calls") or {}
    for stage, roles in f.get("by_stage", {}).items():
        for role, v in roles.items():
            lines.append(f"failed calls: {stage} {role}: {v['failed']} of {v['calls']}; "
                         f"most common ({v['common_count']}x): {v['common'][:120]}")
    return "\n".join(lines)
