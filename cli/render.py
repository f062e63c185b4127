"""Turning engine progress, runs and events into terminal text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from rich.cells import cell_len

from skillstate.cli.grading_view import grading_lines
from skillstate.cli.log_view import event_summary
from skillstate.cli.notes import tool_use_lines, trigger_lines, unrecorded_lines
from skillstate.cli.tables import (
    MIN_SHRUNK,
    Col,
    clip,
    fmt,
    output_width,
    shorten,
    table_lines,
    text_block,
    wrapped,
)
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
    StepStarted,
    TestEvaluated,
)
from skillstate.log.events_bank import BankEvolved, BankSeeded, BankValidated, SkillsDistilled
from skillstate.log.events_repair import EditsAblated
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.log.events_screen import EditsScreened
from skillstate.log.reducer import RunState
from skillstate.reading import selection_report

if TYPE_CHECKING:  # (the engine is imported by the commands that run one)
    from skillstate.engine.context import Progress


def _n(value: int) -> str:
    return f"{value / 1000:.1f}k" if value >= 10_000 else str(value)


class ProgressPrinter:
    """Prints one line per stage of each step; the library itself never prints."""

    def __init__(self, echo=click.echo):
        self.echo = echo
        self._patches: list[PatchProposed] = []

    def __call__(self, p: Progress) -> None:
        if p.kind == "warning":
            click.echo(f"warning: {p.stage}", err=True)
            return
        if p.kind == "notice":  # a line the engine has for people (a run waiting for a review's decision)
            self._flush()
            self.echo(p.stage)
            return
        if p.kind != "event":
            return
        ev = p.event
        assert ev is not None  # a Progress of kind "event" always carries its event
        if isinstance(ev, PatchProposed):
            self._patches.append(ev)
            return
        self._flush()
        line = self.line(ev, p.state)
        if line:
            self.echo(line)

    def _flush(self) -> None:
        if not self._patches:
            return
        edits = sum(len(x.edits) for x in self._patches)
        bad = sum(1 for x in self._patches if x.status != "ok")
        extra = f", {bad} unusable" if bad else ""
        self.echo(f"    reflect    {len(self._patches)} patches{extra}, {edits} edits proposed")
        self._patches = []

    def line(self, ev: Event, state: RunState) -> str | None:
        if isinstance(ev, BaselineEvaluated):
            sc = ev.scores
            return f"baseline       {ev.split}: hard {fmt(sc.hard)}  soft {fmt(sc.soft)}  gate {fmt(sc.gate)}"
        if isinstance(ev, StepStarted):
            return (f"step {ev.step}/{state.total_steps}  epoch {ev.epoch}  budget {ev.edit_budget}  "
                    f"batch {len(ev.batch_item_ids)}")
        if isinstance(ev, RolloutCompleted):
            ok = sum(1 for r in ev.results if r.hard >= 1)
            return f"    rollout    {ok}/{len(ev.results)} solved"
        if isinstance(ev, PatchesMerged):
            fallbacks = sum(1 for m in ev.merges if m.status != "ok")
            extra = f", {fallbacks} fell back" if fallbacks else ""
            return f"    aggregate  {len(ev.edits)} edits after {len(ev.merges)} merge calls{extra}"
        if isinstance(ev, LearningRateChosen):
            asked = f", asked {ev.requested}" if ev.requested is not None else f", reply {ev.status}"
            return f"    lr         apply {ev.chosen} of {ev.candidates} edits{asked}"
        if isinstance(ev, EditsSelected):
            return f"    select     {len(ev.edits)} of {ev.candidates} edits ({ev.method}{selection_notes(ev)})"
        if isinstance(ev, (SkillsDistilled, BankValidated, BankEvolved, BankSeeded)):
            return f"    {_BANK_STAGE[ev.type]:<11}{event_summary(ev)}"
        if isinstance(ev, CandidateBuilt):
            if ev.method == "evolve":
                return "    update     the evolved bank is the candidate"
            if ev.method != "patch":
                how = "rewritten" if ev.status == "ok" else f"rewrite {ev.status}, unchanged"
                return f"    update     {ev.method}: {how if ev.changed or ev.status != 'ok' else 'no change'}"
            changed = sum(1 for r in ev.report if r.status in ("applied", "appended"))
            return f"    update     {changed} of {len(ev.report)} edits changed the skill"
        if isinstance(ev, CandidateEvaluated):
            if ev.partial is not None:  # the gate score of a prefix says little: the bound decided
                return (f"    evaluate   {ev.split}: rejected early after {ev.partial.scored} of {ev.partial.of} "
                        f"items (at most {fmt(ev.partial.upper_bound)})")
            cached = " (score cache)" if ev.cached else ""
            return f"    evaluate   {ev.split}: gate {fmt(ev.scores.gate)}{cached}"
        if isinstance(ev, GateDecided):
            return f"    gate       {ev.decision}: {ev.reason}"
        if isinstance(ev, EditsAblated):  # a step with nothing to repair (no call made) prints nothing
            return f"    repair     {event_summary(ev)}" if ev.ablations else None
        if isinstance(ev, TestEvaluated):
            where = f"test           {ev.label}" if ev.label != "eval" else f"eval           {ev.split}"
            return f"{where}: hard {fmt(ev.scores.hard)}  soft {fmt(ev.scores.soft)}"
        t = ev.type
        if t == "StopConditionMet":
            return f"stopped        {event_summary(ev)}"
        if t in EPOCH_EVENTS:
            return f"{'final' if t == 'FinalValidated' else 'epoch end':15}{t}  {event_summary(ev)}"
        if t in ("PruneProposed", "PruneDecided"):
            return f"    prune      {event_summary(ev)}"
        if isinstance(ev, EditsScreened):  # a step with nothing to try (no call made) prints nothing
            return f"    screen     {ev.reason}" if ev.tried else None
        if t in ("SelectionScored", "FinalSelected"):
            return f"final          {t}  {event_summary(ev)}"
        if isinstance(ev, (ReviewRequested, ReviewDecided)):
            from skillstate.reading.review import review_line

            return f"    review     {review_line(ev)}"
        return None


_BANK_STAGE = {"SkillsDistilled": "distill", "BankValidated": "validate", "BankEvolved": "evolve",
               "BankSeeded": "import"}
EPOCH_EVENTS = ("EpochCompared", "SlowUpdateProposed", "SlowUpdateDecided", "MetaSkillWritten", "FinalValidated")


_DROP_NOTES = {"no_change": "would change nothing", "duplicate": "would change nothing",
               "rejected_before": "rejected before", "screened_out": "screened out",
               "dangling_link": "left out for a link to nothing"}


def selection_notes(ev: EditsSelected) -> str:
    """What selection left out and why, and the creations kept with a link to them: ", 2 would change
    nothing, 1 rejected before, 1 file kept with its link"."""
    counts: dict[str, int] = {}
    for d in ev.dropped:
        note = _DROP_NOTES.get(d.reason, "would change nothing")
        counts[note] = counts.get(note, 0) + 1
    order = list(dict.fromkeys(_DROP_NOTES.values()))
    notes = [f"{counts[note]} {note}" for note in order if note in counts]
    if ev.paired:
        notes.append(f"{len(ev.paired)} file{'s' if len(ev.paired) > 1 else ''} kept with the link to "
                     f"{'them' if len(ev.paired) > 1 else 'it'}")
    return "".join(f", {note}" for note in notes)


def _usd(value: float) -> str:
    return f"{value:.4f}"


def cost_lines(cost: dict[str, Any], width: int | None = None) -> list[str]:
    width = output_width() if width is None else width
    roles = ("optimizer", "target", *sorted(set(cost["paid_by_role"]) - {"optimizer", "target"}))
    rows = []
    calls = cost["calls_by_stage"]
    for stage, by_role in cost["by_stage"].items():
        vals = [by_role.get(r, 0.0) for r in roles]
        rows.append([stage, f"{calls.get(stage, 0):,}", *map(_usd, vals), _usd(sum(vals))])
    for label, key, count in (("all stages", "by_role", "calls"), ("paid (sent)", "paid_by_role", "paid_calls")):
        vals = [cost[key].get(r, 0.0) for r in roles]
        rows.append([label, f"{cost[count]:,}", *map(_usd, vals), _usd(sum(vals))])
    lines = table_lines([Col("cost (USD)", shrink=True), *(Col(h, num=True) for h in ("calls", *roles, "total"))],
                        rows, width)
    models = ", ".join(f"{r} {m}" for r, m in cost["models"].items())
    lines.extend(wrapped(f"at list prices per 1M tokens ({models}); the stage rows include calls served from "
                         "the log", width))
    for model in cost["unpriced_models"]:
        lines.extend(wrapped(f"no price for {model}: counted as $0 (set prices in the config)", width))
    return lines


def warnings_only(p: Progress) -> None:
    """The progress callback of --quiet and --json: warnings (to stderr) only."""
    if p.kind == "warning":
        click.echo(f"warning: {p.stage}", err=True)


def printer(quiet: bool):
    return warnings_only if quiet else ProgressPrinter()


def _headline(run_id: str, rest: str, width: int, sep: str = ": ") -> list[str]:
    """`run ID<sep>rest`, folded to the width; an id too long for one line is cut."""
    return wrapped(f"run {clip(run_id, max(width - 5, 8))}{sep}{rest}", width)


def eval_text(s: dict[str, Any], width: int | None = None) -> str:
    width = output_width() if width is None else width
    ev = s["test"].get("eval")
    lines = wrapped(f"eval run {clip(s['run_id'], max(width - 10, 8))}: {s['status']}", width)
    if ev:
        lines.extend(wrapped(f"  {ev['split']} ({ev['n']} items): hard {fmt(ev['hard'])}  soft {fmt(ev['soft'])}",
                             width))
        lines.append("")
        lines.extend(table_lines(
            [Col("by task type", shrink=True), Col("n", num=True), Col("hard", num=True), Col("soft", num=True)],
            [[task, v["n"], fmt(v["hard"]), fmt(v["soft"])] for task, v in ev["by_task_type"].items()], width))
    lines.append("")
    lines.extend(usage_lines(s["usage"], width))
    lines.append("")
    lines.extend(cost_lines(s["cost"], width))
    lines.extend(tool_use_lines(s, width))
    lines.extend(trigger_lines(s, width))
    lines.extend(failure_lines(s, width))
    return "\n".join(lines)


def failed_calls_table(by_stage: dict[str, Any], width: int, title: str = "failed LLM calls",
                       indent: int = 0) -> list[str]:
    """Failed calls per stage and role with the most common error."""
    rows = [[f"{stage} {role}", v["failed"], v["calls"], f"{v['common_count']}x {v['common']}"]
            for stage, roles in by_stage.items() for role, v in roles.items()]
    return table_lines([Col(title), Col("failed", num=True), Col("of calls", num=True),
                        Col("most common error", shrink=True)], rows, width, indent=indent)


def failed_calls_sentence(s: dict[str, Any], width: int) -> str:
    """The summary's closing line when calls failed: one line, cut to the width."""
    f = s["failures"]
    calls = f"{f['failed']} failed LLM call{'s' * (f['failed'] != 1)} of {f['calls']}"
    for tail in (": its scores count them as failures (details: skillstate show --step N)",
                 ": its scores count them as failures", ": scored as failures", ""):
        line = f"run {s['run_id']} {s['status']} with {calls}{tail}"
        if cell_len(line) <= width:
            return line
    fixed = cell_len(line) - cell_len(s["run_id"])
    if width - fixed >= MIN_SHRUNK:
        return f"run {clip(s['run_id'], width - fixed)} {s['status']} with {calls}"
    return clip(line, width)


def failure_lines(s: dict[str, Any], width: int | None = None) -> list[str]:
    """Failed LLM calls per stage and role, ending with one line that says so;
    nothing when no call failed."""
    width = output_width() if width is None else width
    f = s.get("failures") or {}
    if not f.get("failed"):
        return []
    return ["", *failed_calls_table(f["by_stage"], width), failed_calls_sentence(s, width)]


def summary_text(s: dict[str, Any], width: int | None = None) -> str:
    """The summary of a run as printed by run, resume, fork, show and eval,
    fitted to `width` (default: the output's width)."""
    width = output_width() if width is None else width
    if s.get("kind") == "eval":
        return eval_text(s, width)
    if s.get("kind") == "policy":
        from skillstate.cli.policy_view import policy_text

        return "\n".join(policy_text(s, width))
    lines = _headline(s["run_id"], f"{s['status']}, {s['steps']} steps; {s['accepts']} accepted "
                                   f"({s['new_best']} new best), {s['rejects']} rejected, {s['skips']} skipped", width)
    if s.get("stopped"):
        lines.extend(wrapped(f"stopped: {s['stopped']['reason']}", width))
    if s.get("max_calls") and s["status"] == "completed" and s["steps"] < s["total_steps"]:
        lines.extend(wrapped(f"max_calls: the steps ended once the run's calls reached {s['max_calls']}, after "
                             f"{s['steps']} of {s['total_steps']} steps", width))
    if s.get("skill_tree"):
        tree = s["skill_tree"]
        what = ("every file is trained" if tree["trained"] == "all"
                else f"{tree['trained']} is trained, the others are kept as read")
        lines.extend(wrapped(f"skill: the Agent Skills directory {tree['name']} ({len(tree['files'])} files; "
                             f"{what})", width))
    lines.append("")
    test = s["test"]
    rows = []
    if "no_skill" in test:  # env evals: the target with no skill at all
        rows.append(["no skill", "-", fmt(test["no_skill"]["hard"]), fmt(test["no_skill"]["soft"])])
    for label, score, key in (("baseline", s["baseline_score"], "baseline"),
                              (f"best (step {s['best_step']})", s["best_score"], "best")):
        t = test.get(key, {})
        rows.append([label, fmt(score), fmt(t.get("hard")), fmt(t.get("soft"))])
    lines.extend(table_lines([Col("skill"), Col(f"val ({s['gate_metric']})", num=True), Col("test hard", num=True),
                              Col("test soft", num=True)], rows, width))
    if "baseline" in test and "best" in test:
        lines.append("")
        lines.extend(task_type_lines(test["baseline"]["by_task_type"], test["best"]["by_task_type"], width))
    if s.get("val_to_test"):
        lines.append("")
        lines.extend(line for text in selection_report.gap_lines(s["val_to_test"]) for line in wrapped(text, width))
    lines.append("")
    lines.extend(usage_lines(s["usage"], width))
    lines.extend(unrecorded_lines(s["usage"], width))
    lines.extend(tool_use_lines(s, width))
    lines.extend(trigger_lines(s, width))
    lines.extend(grading_lines(s.get("grading"), width))
    if s.get("cost"):
        lines.append("")
        lines.extend(cost_lines(s["cost"], width))
    lines.extend(failure_lines(s, width))
    return "\n".join(lines)


def usage_lines(usage: dict[str, Any], width: int | None = None) -> list[str]:
    # served from the log: the calls the events count, less the sent ones they use
    rows = [[role, u["calls"], max(u["calls"] - (u["sent"] - u.get("unused", 0) - u.get("failed_unrecorded", 0)), 0),
             _n(u["prompt_tokens"]),
             _n(u["completion_tokens"])] for role, u in usage.items()]
    return table_lines([Col("LLM calls", shrink=True), *(Col(h, num=True) for h in
                        ("calls", "from log", "prompt tok", "completion tok"))], rows, width)


def task_type_lines(baseline: dict[str, Any], best: dict[str, Any], width: int | None = None) -> list[str]:
    """Test results per task type, baseline and best side by side."""
    rows = []
    for task in sorted(set(baseline) | set(best)):
        a, b = baseline.get(task, {}), best.get(task, {})
        change = f"{b['hard'] - a['hard']:+.3f}" if a and b else "-"
        rows.append([task, (a or b).get("n", 0), fmt(a.get("hard")), fmt(b.get("hard")), change])
    return table_lines([Col("test by task type", shrink=True), *(Col(h, num=True) for h in
                        ("n", "baseline", "best", "change"))], rows, width)


def bank_lines(bank, width: int | None = None) -> list[str]:
    """`show` of a bank run: the best bank's skills (and its mistakes), one row each."""
    rows = [[sk.id, sk.category or "general", sk.provenance.origin, sk.provenance.step, sk.title, sk.principle]
            for sk in bank.skills]
    lines = [f"best bank: {len(bank.skills)} skills ({len(bank.general())} general), {len(bank.mistakes)} mistakes"]
    if rows:
        lines.extend(table_lines([Col("skill"), Col("category", shrink=True), Col("origin"), Col("step", num=True),
                                  Col("title", shrink=True), Col("principle", shrink=True)], rows, width))
    return lines


BOUND_MARK = "≤"


def history_lines(history, width: int | None = None, labels: dict[int, str] | None = None,
                  bounds: dict[int, Any] | None = None) -> list[str]:
    """`show`'s table of steps: the budget, the decision and the scores of each. With `labels` (a bank run's,
    `skillstate.reading.bank_steps.step_labels`): what each step did instead of a budget and a decision. A
    candidate rejected early (`bounds`, `skillstate.reading.history.early_rejects`) has no score, only the most
    it could have scored: that bound is marked ≤, and a line under the table says so."""
    width = output_width() if width is None else width
    bounds = bounds or {}

    def candidate(rec) -> str:
        return BOUND_MARK + fmt(rec.candidate_score) if rec.step in bounds else fmt(rec.candidate_score)

    if labels is not None:
        rows = [[rec.step, rec.epoch, labels.get(rec.step, rec.decision), candidate(rec),
                 fmt(rec.current_score), fmt(rec.best_score)] for rec in history]
        lines = table_lines([Col("step", num=True), Col("epoch", num=True), Col("what the step did", shrink=True),
                             Col("candidate", num=True), Col("current", num=True), Col("best", num=True)], rows,
                            width)
    else:
        rows = [[rec.step, rec.epoch, rec.edit_budget, rec.decision, candidate(rec), fmt(rec.current_score),
                 fmt(rec.best_score)] for rec in history]
        cols = [Col("step", num=True), Col("epoch", num=True), Col("budget", num=True), Col("decision", shrink=True),
                Col("candidate", num=True), Col("current", num=True), Col("best", num=True)]
        lines = table_lines(cols, rows, width)
    if any(rec.step in bounds for rec in history):
        lines.extend(wrapped(f"{BOUND_MARK}: rejected early, at most this score (show --step N: how many items "
                             "were scored)", width))
    return lines


def why_text(info: dict[str, Any], width: int | None = None) -> str:
    """`skillstate why`: where the text came from, folded to `width` (default: the output's width). An edit's
    content is shown as it is, its lines under one another; long texts are cut at a word, with an ellipsis."""
    width = output_width() if width is None else width
    where = [name for name, key in (("initial", "in_initial_skill"), ("current", "in_current_skill"),
                                    ("best", "in_best_skill")) if info[key]]
    found = "the " + " and ".join(where) + " skill" if where else "no skill of this run (initial, current or best)"
    lines = [f"run {info['run_id']}: {info['text']!r} is in {found}"]
    if info.get("in_files"):
        lines.append(f"  also in {', '.join(info['in_files'])} (kept as read from the skill directory)")
    if info.get("in_trained_files"):
        lines.append(f"  in the current skill's {', '.join(info['in_trained_files'])}")
    for c in info["changes"]:
        when = (f"step {c['step']} (epoch {c['epoch']})" if c["by"] == "step"
                else f"prune after step {c['step']} (epoch {c['epoch']})" if c["by"] == "prune"
                else f"step {c['step']} (epoch {c['epoch']}) built on another accepted skill" if c["by"] == "parent"
                else f"slow update at the end of epoch {c['epoch']}")
        lines.extend(wrapped(f"  {when}: {c['change']} by {c['decision']} ({c['reason']})", width, "    "))
        for d in c.get("deleted", []):
            of = f" of {d['of']!r}" if d["of"] else ""
            lines.extend(wrapped(f"    deleted {d['line']!r}: {' and '.join(d['reasons'])}{of}", width, "      "))
    for d in info.get("dropped", []):  # repair: ablate
        how = "dropped by the repair" if d.get("kept_as") is None else \
            f"left out by the repair (kept as {shorten(d['kept_as'], 200)!r})"
        lines.extend(wrapped(f"  step {d['step']}: {how}: {d['op']} {shorten(d['content'], 200)!r} broke "
                             f"{', '.join(d['broke'])} ({d['items']} items scored {d['candidate_score']:.3f} with "
                             f"it, {d['without_score']:.3f} without it, {d['recovered']:+g})", width, "    "))
    origin = info["origin"]
    if origin is None:
        if info["in_current_skill"] and info["in_initial_skill"]:
            lines.append("  it was in the initial skill and no accepted step removed it")
        return "\n".join(lines)
    if "slow_update_epoch" in origin:
        lines.extend(wrapped(f"the slow update of epoch {origin['slow_update_epoch']} wrote it into the guidance "
                             f"block, after comparing the epoch's skills on {sum(origin['comparison'].values())} "
                             f"train items ({', '.join(f'{n} {k}' for k, n in sorted(origin['comparison'].items()))})",
                             width))
        if origin["reasoning"]:
            lines.extend(wrapped(f"  reasoning: {shorten(origin['reasoning'], 300)}", width, "    "))
        return "\n".join(lines)
    lines.append(f"step {origin['step']} kept ({origin['method']}):")
    for e in origin["kept_edits"]:
        file = f"{e['file']}, " if e.get("file") else ""
        lines.extend(text_block(f"  [{e['status'] or origin['method']}] {e['op']} ({file}{e['source']}, support "
                                f"{e['support']}): ", e["content"] or e["target"], width))
    for p in origin["proposed_by"]:
        lines.append(f"proposed by the {p['source']} analyst, minibatch {p['minibatch']}:")
        for s in p["failure_summary"]:
            lines.extend(wrapped(f"  pattern: {shorten(s, 300)}", width, "    "))
        if p["reasoning"]:
            lines.extend(wrapped(f"  reasoning: {shorten(p['reasoning'], 300)}", width, "    "))
        for c in p.get("failed_checks", [])[:5]:  # env evals: the expectations these items failed
            lines.extend(wrapped(f"  failed {c['kind']} ({c['items']} of {len(p['items'])} items): "
                                 f"{shorten(c['check'], 200)}", width, "    "))
        for item in p["items"][:10]:
            reason = item["fail_reason"] or "solved"
            lines.extend(wrapped(f"  - {item['item_id']} [{item['task_type']}] {shorten(reason, 160)}", width,
                                 "    "))
        if len(p["items"]) > 10:
            lines.append(f"  ... {len(p['items']) - 10} more items")
    return "\n".join(lines)
