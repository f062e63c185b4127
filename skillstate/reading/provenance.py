"""Why is this sentence in the skill? Trace a text through the log: the step
that added it, the kept edit, the analysts who proposed it and the failures
they were looking at; and every later step that removed or re-added it."""

from __future__ import annotations

from typing import Any, cast

from skillstate.engine.loading import LoadedRun, load_run
from skillstate.errors import UserError
from skillstate.log.events import Edit, GateDecided, PatchProposed, RolloutCompleted
from skillstate.log.events_epoch import SlowUpdateDecided
from skillstate.log.events_pareto import ParentChosen
from skillstate.log.events_repair import EditsAblated
from skillstate.log.prune_events import PruneDecided, PruneProposed
from skillstate.log.reducer import RunState, need, reduce
from skillstate.reading.skill_text import skill_text, stored_files
from skillstate.skillopt import repair as repair_rules
from skillstate.storage.store import Store


def failed_checks(store: Store, results: list[Any]) -> list[dict[str, Any]]:
    """Env evals: the checks (expectations, assertions) the analyst's items failed, the most failed first, each
    with how many of the items failed it; empty for results whose trajectories hold no grading."""
    from collections import Counter

    from skillstate.reading.grading import gradings

    failed: Counter[tuple[str, str]] = Counter()
    for grading in gradings(store, results).values():
        failed.update({(c["kind"], c["text"]) for c in grading.get("checks", []) if c.get("passed") is False})
    return [{"check": text, "kind": kind, "items": n}
            for (kind, text), n in sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))]


def _touches(edit: Edit, text: str) -> bool:
    return bool(edit.content) and (text in edit.content or edit.content.strip() in text)


def explain(store: Store, run_id: str | None, text: str, loaded: LoadedRun | None = None) -> dict[str, Any]:
    """Where `text` came from in the run (`loaded`, when the caller has folded it already)."""
    text = text.strip()
    if not text:
        raise UserError("give the text to look for, e.g. skillstate why \"order of operations\"")
    loaded = loaded or load_run(store, run_id)
    state = loaded.state
    initial = skill_text(store, need(state.initial_skill, "the initial skill"))
    changes: list[dict[str, Any]] = []
    step_events: dict[int, list] = {}
    boundary_events: dict[int, list] = {}
    present = text in initial
    folded = RunState()
    dropped: list[dict[str, Any]] = []
    # parent_selection pareto can make an older skill current again: for each skill that held the text, the
    # change that put it into that skill's line of descent, and the one in effect for the current skill
    holder: dict[str, dict[str, Any]] = {}
    responsible: dict[str, Any] | None = None
    for s in loaded.lineage:  # fold the log, noting every change of the current skill
        ev = s.event
        if isinstance(ev, EditsAblated):  # repair: an edit left out because it did harm
            dropped += dropped_edits(ev, text)
        before, proposal = folded.current_skill, folded.prune
        folded = reduce(folded, ev)
        step = getattr(ev, "step", None)
        if step is not None:
            step_events.setdefault(step, []).append(ev)
        elif hasattr(ev, "epoch") and ev.type != "StepStarted":
            boundary_events.setdefault(ev.epoch, []).append(ev)
        if before is None or folded.current_skill == before or ev.type == "RunStarted":
            continue
        current = need(folded.current_skill, "the current skill")
        now = text in skill_text(store, current)
        if isinstance(ev, ParentChosen):  # the step builds on another skill: it holds the text or not
            responsible = holder.get(current) if now else None
            if now != present:
                changes.append({"change": "added" if now else "removed", "step": ev.step, "epoch": ev_epoch(folded),
                                "decision": "parent", "reason": ev.reason, "by": "parent"})
            present = now
            continue
        if now == present:
            if now and responsible is not None:
                holder.setdefault(current, responsible)
            continue
        change: dict[str, Any] = {"change": "added" if now else "removed"}
        if isinstance(ev, GateDecided):
            change.update(step=ev.step, epoch=folded.history[-1].epoch, decision=ev.decision, reason=ev.reason,
                          by="step")
            if ev.paired is not None or ev.type_guard is not None:  # the robust rules' verdicts (also in the reason)
                change.update(paired=ev.paired.model_dump() if ev.paired else None,
                              type_guard=ev.type_guard.model_dump() if ev.type_guard else None)
        elif isinstance(ev, PruneDecided) and proposal is not None:  # a prune: the lines it deleted, and why
            change.update(prune_change(proposal, ev, text))
        else:  # the slow update of an epoch boundary
            su = cast(SlowUpdateDecided, ev)  # the only other event that changes the current skill (see the reducer)
            change.update(step=folded.last_completed_step, epoch=su.epoch, decision=su.decision, reason=su.reason,
                          by="slow_update")
        changes.append(change)
        present = now
        responsible = change if now else None
        if now:
            holder.setdefault(current, change)
    origin: dict[str, Any] | None = None
    if present and responsible is not None:
        origin = (_origin(store, step_events[responsible["step"]], text) if responsible["by"] == "step"
                  else _slow_origin(boundary_events[responsible["epoch"]]) if responsible["by"] == "slow_update"
                  else None)
    current_text = skill_text(store, need(state.current_skill, "the current skill"))
    where = {"in_initial_skill": text in initial,
             "in_current_skill": text in current_text,
             "in_best_skill": text in skill_text(store, need(state.best_skill, "the best skill"))}
    # a run that trains the whole directory: the files that hold it now
    trained = stored_files(store, need(state.current_skill, "the current skill")) or {}
    return {
        "run_id": loaded.run_id,
        "text": text,
        **where,
        # a run of an Agent Skills directory: the other files that hold the text (kept as read, never trained)
        **({"in_files": kept_files_with(store, state.skill_tree, text)} if state.skill_tree and not trained else {}),
        **({"in_trained_files": [p for p, t in trained.items() if text in t]} if trained else {}),
        # False: the text was never in the run's current skill (nor is in its best): nothing to explain
        "found": any(where.values()) or bool(changes) or bool(dropped),
        "changes": changes,
        "dropped": dropped,
        "origin": origin,
    }


def kept_files_with(store: Store, root: str, text: str) -> list[str]:
    """The paths of the skill directory's files other than its SKILL.md that hold `text`."""

    from skillstate.skilltree import decode_tree, skill_md_path

    tree = decode_tree(store.get_blob(root), store.get_blobs)
    trained = skill_md_path(tree)
    return [path for path, f in tree.items() if path != trained and not f.is_binary and text in f.text]


def ev_epoch(state: RunState) -> int:
    """The epoch of the step under way."""
    return state.progress.epoch if state.progress is not None else state.epoch


def prune_change(proposal: PruneProposed, ev: PruneDecided, text: str) -> dict[str, Any]:
    """A prune's change of the current skill: its decision and the deleted lines that held `text`."""
    lines = [{"line": p.line, "reasons": p.reasons, "of": p.of} for p in proposal.lines if text in p.line]
    return {"step": ev.after_step, "epoch": ev.epoch, "decision": ev.decision, "reason": ev.reason, "by": "prune",
            "deleted": lines or [{"line": p.line, "reasons": p.reasons, "of": p.of} for p in proposal.lines],
            "paired": ev.paired.model_dump() if ev.paired else None,
            "type_guard": ev.type_guard.model_dump() if ev.type_guard else None}


def _slow_origin(events: list) -> dict[str, Any]:
    """The slow update that wrote the guidance, and the comparison it read."""
    by_type = {ev.type: ev for ev in events}
    proposed, compared = by_type["SlowUpdateProposed"], by_type["EpochCompared"]
    counts: dict[str, int] = {}
    for lab in compared.labels.values():
        counts[lab] = counts.get(lab, 0) + 1
    return {"slow_update_epoch": proposed.epoch, "guidance": proposed.guidance, "reasoning": proposed.reasoning,
            "comparison": counts, "kept_edits": [], "proposed_by": []}


def _origin(store: Store, events: list, text: str) -> dict[str, Any]:
    """The kept edits of the step that added `text`, and who proposed them
    (in full_rewrite mode: the analysts whose whole skill held it)."""
    by_type = {ev.type: ev for ev in events}
    selected = by_type.get("EditsSelected")
    built = by_type["CandidateBuilt"]
    report = built.report
    rollout: RolloutCompleted = by_type["RolloutCompleted"]
    results = {r.item_id: r for r in rollout.results}
    repaired = by_type.get("EditsAblated")
    searched = by_type.get("BlockerSearched")
    # the report is the built candidate's: after a repair, of the edits it kept (some without a clause); after
    # a search that put back an edit the screen left out (blocker_screened), of that edit alone
    applied = ([searched.screened_edit] if searched is not None and searched.found is not None
               and searched.screened_edit is not None
               else repair_rules.applied_after(selected.edits, repaired) if selected else [])
    kept = [(k, e) for k, e in enumerate(applied) if _touches(e, text)]
    patches: list[PatchProposed] = [ev for ev in events if ev.type == "PatchProposed"]
    proposals = []
    for patch in patches:
        matching = [e for e in patch.edits if any(e.content == k.content for _, k in kept) or _touches(e, text)]
        if patch.skill and text in skill_text(store, patch.skill):
            matching.append(Edit(op="rewrite", content=text, source=patch.source))
        if not matching:
            continue
        checks = failed_checks(store, [results[i] for i in patch.item_ids if i in results])
        proposals.append({
            "source": patch.source, "minibatch": patch.minibatch, "reasoning": patch.reasoning,
            "failure_summary": patch.failure_summary,
            "edits": [{"op": e.op, "target": e.target, "content": e.content} for e in matching],
            "items": [{"item_id": i, "task_type": results[i].task_type, "hard": results[i].hard,
                       "fail_reason": results[i].fail_reason} for i in patch.item_ids if i in results],
            **({"failed_checks": checks} if checks else {}),
        })
    return {
        "step": built.step,
        "method": built.method,
        "kept_edits": [{"op": e.op, "file": e.file, "target": e.target, "content": e.content, "source": e.source,
                        "support": e.support, "status": report[i].status if i < len(report) else None}
                       for i, e in kept],
        "proposed_by": proposals,
    }


def dropped_edits(ev: EditsAblated, text: str) -> list[dict[str, Any]]:
    """The edits a repair dropped, or applied without a clause, that hold `text` (and, for a clause left out,
    where the edit as applied no longer does), with what their ablation showed."""
    return [{"step": ev.step, "op": a.edit.op, "content": a.edit.content, "broke": ev.affected_types,
             "items": len(ev.item_ids), "candidate_score": ev.candidate_score, "without_score": a.score,
             "recovered": a.recovered, "reason": ev.reason,
             "kept_as": a.kept_as.content if a.kept_as is not None else None}
            for a in ev.ablations if a.harmful and _touches(a.edit, text)
            and (a.index in ev.dropped or (a.kept_as is not None and not _touches(a.kept_as, text)))]
