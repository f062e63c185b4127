"""`skillstate log`: the event stream, one line an event."""

from __future__ import annotations

import json
from collections import Counter

from skillstate.cli.tables import Col, fmt, table_lines
from skillstate.log.events import (
    BaselineEvaluated,
    CandidateBuilt,
    CandidateEvaluated,
    EditsSelected,
    Event,
    GateDecided,
    LearningRateChosen,
    PatchesMerged,
    PatchProposed,
    RolloutCompleted,
    RunCompleted,
    RunForked,
    RunStarted,
    StepStarted,
    StopConditionMet,
    TestEvaluated,
)
from skillstate.log.events_bank import BankEvolved, BankSeeded, BankValidated, SkillsDistilled
from skillstate.log.events_epoch import (
    EpochCompared,
    EpochEnded,
    FinalValidated,
    MetaSkillWritten,
    SlowUpdateDecided,
    SlowUpdateProposed,
)
from skillstate.log.events_pareto import ParentChosen
from skillstate.log.events_repair import EditsAblated
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.log.prune_events import PruneDecided, PruneProposed
from skillstate.log.selection_events import FinalSelected, SelectionScored
from skillstate.reading import selection_report


def log_lines(events, lineage: bool, width: int | None = None) -> list[str]:
    """`skillstate log`: one row per event, its summary cut to the width."""
    cols = [Col("seq", num=True), Col("event"), Col("step", num=True), Col("summary", shrink=True)]
    rows = [[s.seq, s.type, "" if s.step is None else s.step, event_summary(s.event)] for s in events]
    if lineage:
        cols.insert(0, Col("run", shrink=True))
        rows = [[s.run_id, *row] for s, row in zip(events, rows, strict=True)]
    return table_lines(cols, rows, width)


def event_summary(ev: Event) -> str:
    if isinstance(ev, RunStarted):
        return f"{ev.total_steps} steps, dataset {ev.dataset_fingerprint[:12]}"
    if isinstance(ev, RunForked):
        return f"from {ev.parent_run_id} at step {ev.fork_step}, overrides {json.dumps(ev.overrides)}"
    if isinstance(ev, (BaselineEvaluated, CandidateEvaluated, TestEvaluated)):
        label = getattr(ev, "label", "")
        return f"{label + ' ' if label else ''}{ev.split} gate {fmt(ev.scores.gate)} hard {fmt(ev.scores.hard)}"
    if isinstance(ev, StepStarted):
        return f"epoch {ev.epoch}, budget {ev.edit_budget}, {len(ev.batch_item_ids)} items"
    if isinstance(ev, SkillsDistilled):
        reasons = Counter(d.reason for d in ev.dropped)
        why = f" ({', '.join(f'{n} {r}' for r, n in sorted(reasons.items()))})" if reasons else ""
        return f"{ev.status}: {len(ev.added)} skills added, {len(ev.dropped)} dropped{why}"
    if isinstance(ev, BankSeeded):
        return (f"{len(ev.statuses)} teacher calls ({', '.join(sorted(set(ev.statuses)))}): {len(ev.added)} skills "
                f"added, {len(ev.dropped)} dropped")
    if isinstance(ev, BankValidated):
        worst = sorted(ev.scores.by_task_type.items(), key=lambda kv: (kv[1].hard, kv[0]))[:2]
        return (f"{ev.split} gate {fmt(ev.scores.gate)}; lowest: "
                + ", ".join(f"{t} {fmt(v.hard)}" for t, v in worst))
    if isinstance(ev, BankEvolved):
        if ev.status == "skipped":
            return "no category below the threshold"
        return f"{ev.status}: {', '.join(ev.categories)}; {len(ev.added)} skills added"
    if isinstance(ev, RolloutCompleted):
        return f"{sum(1 for r in ev.results if r.hard >= 1)}/{len(ev.results)} solved"
    if isinstance(ev, PatchProposed):
        return f"{ev.source}#{ev.minibatch} {ev.status}, {len(ev.edits)} edits from {len(ev.item_ids)} items"
    if isinstance(ev, PatchesMerged):
        return f"{len(ev.edits)} edits ({len(ev.merges)} merge calls)"
    if isinstance(ev, EditsSelected):
        dropped = f", {len(ev.dropped)} dropped as no-ops" if ev.dropped else ""
        return f"{len(ev.edits)}/{ev.candidates} kept, budget {ev.budget}, {ev.method}{dropped}"
    if isinstance(ev, CandidateBuilt):
        if ev.method == "evolve":
            return "the evolved bank"
        return ", ".join(f"{r.op}:{r.status}" for r in ev.report) or "no edits"
    if isinstance(ev, GateDecided):
        return f"{ev.decision}: {ev.reason}"
    if isinstance(ev, EditsAblated):
        return ev.reason
    if isinstance(ev, ParentChosen):
        return f"parent scored {fmt(ev.score)}: {ev.reason}"
    if isinstance(ev, LearningRateChosen):
        return f"apply {ev.chosen} of {ev.candidates} ({ev.status}{', asked ' + ev.requested if ev.requested else ''})"
    if isinstance(ev, EpochCompared):
        counts: dict[str, int] = {}
        for lab in ev.labels.values():
            counts[lab] = counts.get(lab, 0) + 1
        return f"epoch {ev.epoch}: " + ", ".join(f"{n} {lab}" for lab, n in sorted(counts.items()))
    if isinstance(ev, SlowUpdateProposed):
        return f"epoch {ev.epoch}: {ev.status}, {len(ev.guidance.splitlines())} guidance lines"
    if isinstance(ev, SlowUpdateDecided):
        return f"epoch {ev.epoch}: {ev.decision}{' (forced)' if ev.forced else ''}: {ev.reason}"
    if isinstance(ev, MetaSkillWritten):
        return f"epoch {ev.epoch}: {ev.status}, {len(ev.memo.splitlines())} memo lines"
    if isinstance(ev, EpochEnded):
        return f"epoch {ev.epoch}"
    if isinstance(ev, FinalValidated):
        verdict = "promoted to best" if ev.promoted else "best kept"
        return f"current {fmt(ev.score)} vs best {fmt(ev.best_score)}: {verdict}"
    if isinstance(ev, StopConditionMet):
        return f"{ev.condition}: {ev.reason}"
    if isinstance(ev, (SelectionScored, FinalSelected)):
        return selection_report.event_summary(ev)
    if isinstance(ev, RunCompleted):
        return f"best {fmt(ev.best_score)} at step {ev.best_step}"
    if isinstance(ev, PruneProposed):
        return (f"after step {ev.after_step}: {len(ev.lines)} line{'' if len(ev.lines) == 1 else 's'} to delete "
                f"({', '.join(sorted({r for p in ev.lines for r in p.reasons})) or 'none'}; optimizer {ev.status})")
    if isinstance(ev, PruneDecided):
        return f"after step {ev.after_step}: {ev.decision}: {ev.reason}"
    if isinstance(ev, (ReviewRequested, ReviewDecided)):
        from skillstate.reading.review import review_line

        return review_line(ev)
    return ""
