"""Turning engine progress, runs and events into terminal text."""

from __future__ import annotations

import json
from typing import Any

import click

from skillstate.engine.context import Progress
from skillstate.events import Event
from skillstate.history import status_of
from skillstate.reducer import RunState


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _n(value: int) -> str:
    return f"{value / 1000:.1f}k" if value >= 10_000 else str(value)


class ProgressPrinter:
    """Prints one line per stage of each step; the library itself never prints."""

    def __init__(self, echo=click.echo):
        self.echo = echo
        self._patches: list[Event] = []

    def __call__(self, p: Progress) -> None:
        if p.kind == "warning":
            click.echo(f"warning: {p.stage}", err=True)
            return
        if p.kind != "event":
            return
        ev = p.event
        if ev.type == "PatchProposed":
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
        t = ev.type
        if t == "BaselineEvaluated":
            return f"baseline       {ev.split}: hard {fmt(ev.scores.hard)}  soft {fmt(ev.scores.soft)}  gate {fmt(ev.scores.gate)}"
        if t == "StepStarted":
            return (f"step {ev.step}/{state.total_steps}  epoch {ev.epoch}  budget {ev.edit_budget}  "
                    f"batch {len(ev.batch_item_ids)}")
        if t == "RolloutCompleted":
            ok = sum(1 for r in ev.results if r.hard >= 1)
            return f"    rollout    {ok}/{len(ev.results)} solved"
        if t == "PatchesMerged":
            fallbacks = sum(1 for m in ev.merges if m.status != "ok")
            extra = f", {fallbacks} fell back" if fallbacks else ""
            return f"    aggregate  {len(ev.edits)} edits after {len(ev.merges)} merge calls{extra}"
        if t == "LearningRateChosen":
            asked = f", asked {ev.requested}" if ev.requested is not None else f", reply {ev.status}"
            return f"    lr         apply {ev.chosen} of {ev.candidates} edits{asked}"
        if t == "EditsSelected":
            return f"    select     {len(ev.edits)} of {ev.candidates} edits ({ev.method})"
        if t == "CandidateBuilt":
            if ev.method != "patch":
                how = "rewritten" if ev.status == "ok" else f"rewrite {ev.status}, unchanged"
                return f"    update     {ev.method}: {how if ev.changed or ev.status != 'ok' else 'no change'}"
            changed = sum(1 for r in ev.report if r.status in ("applied", "appended"))
            return f"    update     {changed} of {len(ev.report)} edits changed the skill"
        if t == "CandidateEvaluated":
            cached = " (score cache)" if ev.cached else ""
            return f"    evaluate   {ev.split}: gate {fmt(ev.scores.gate)}{cached}"
        if t == "GateDecided":
            return f"    gate       {ev.decision}: {ev.reason}"
        if t == "TestEvaluated":
            where = f"test           {ev.label}" if ev.label != "eval" else f"eval           {ev.split}"
            return f"{where}: hard {fmt(ev.scores.hard)}  soft {fmt(ev.scores.soft)}"
        if t in EPOCH_EVENTS:
            return f"{'final' if t == 'FinalValidated' else 'epoch end':15}{t}  {event_summary(ev)}"
        return None


EPOCH_EVENTS = ("EpochCompared", "SlowUpdateProposed", "SlowUpdateDecided", "MetaSkillWritten", "FinalValidated")


def cost_lines(cost: dict[str, Any]) -> list[str]:
    roles = ("optimizer", "target")
    lines = [f"cost (USD)      {roles[0]:>10}{roles[1]:>10}{'total':>10}"]
    for stage, by_role in cost["by_stage"].items():
        vals = [by_role.get(r, 0.0) for r in roles]
        lines.append(f"  {stage:14}" + "".join(f"{v:>10.4f}" for v in vals) + f"{sum(vals):>10.4f}")
    vals = [cost["by_role"].get(r, 0.0) for r in roles]
    lines.append(f"  {'all stages':14}" + "".join(f"{v:>10.4f}" for v in vals) + f"{sum(vals):>10.4f}")
    vals = [cost["paid_by_role"].get(r, 0.0) for r in roles]
    lines.append(f"  {'paid (sent)':14}" + "".join(f"{v:>10.4f}" for v in vals) + f"{sum(vals):>10.4f}")
    models = ", ".join(f"{r} {m}" for r, m in cost["models"].items())
    lines.append(f"  at list prices per 1M tokens ({models}); the stage rows include calls served from the log")
    for model in cost["unpriced_models"]:
        lines.append(f"  no price for {model}: counted as $0 (set prices in the config)")
    return lines


def warnings_only(p: Progress) -> None:
    """The progress callback of --quiet and --json: warnings (to stderr) only."""
    if p.kind == "warning":
        click.echo(f"warning: {p.stage}", err=True)


def printer(quiet: bool):
    return warnings_only if quiet else ProgressPrinter()


def eval_text(s: dict[str, Any]) -> str:
    ev = s["test"].get("eval")
    lines = [f"eval run {s['run_id']}: {s['status']}"]
    if ev:
        lines.append(f"  {ev['split']} ({ev['n']} items): hard {fmt(ev['hard'])}  soft {fmt(ev['soft'])}")
        lines.append("")
        lines.append(f"{'by task type':24}{'n':>4}{'hard':>8}{'soft':>8}")
        for task, v in ev["by_task_type"].items():
            lines.append(f"  {task:22}{v['n']:>4}{fmt(v['hard']):>8}{fmt(v['soft']):>8}")
    lines.append("")
    lines.extend(usage_lines(s["usage"]))
    lines.append("")
    lines.extend(cost_lines(s["cost"]))
    lines.extend(failure_lines(s))
    return "\n".join(lines)


def failure_lines(s: dict[str, Any]) -> list[str]:
    """Failed LLM calls per stage and role, ending with one line that says so;
    nothing when no call failed."""
    f = s.get("failures") or {}
    if not f.get("failed"):
        return []
    lines = ["", "failed LLM calls       failed   of calls  most common error"]
    for stage, roles in f["by_stage"].items():
        for role, v in roles.items():
            lines.append(f"  {stage + ' ' + role:20}{v['failed']:>8}{v['calls']:>11}  "
                         f"{v['common_count']}x {v['common'][:120]}")
    lines.append(f"run {s['run_id']} {s['status']} with {f['failed']} failed LLM call{'s' * (f['failed'] != 1)} "
                 f"of {f['calls']}: its scores count them as failures (details: skillstate show --step N)")
    return lines


def summary_text(s: dict[str, Any]) -> str:
    if s.get("kind") == "eval":
        return eval_text(s)
    lines = [
        f"run {s['run_id']}: {s['status']}, {s['steps']} steps; "
        f"{s['accepts']} accepted ({s['new_best']} new best), {s['rejects']} rejected, {s['skips']} skipped",
        "",
        f"{'':16}{'val (' + str(s['gate_metric']) + ')':>12}{'test hard':>12}{'test soft':>12}",
    ]
    test = s["test"]
    for label, score, key in (("baseline", s["baseline_score"], "baseline"),
                              (f"best (step {s['best_step']})", s["best_score"], "best")):
        t = test.get(key, {})
        lines.append(f"{label:16}{fmt(score):>12}{fmt(t.get('hard')):>12}{fmt(t.get('soft')):>12}")
    if "baseline" in test and "best" in test:
        lines.append("")
        lines.extend(task_type_lines(test["baseline"]["by_task_type"], test["best"]["by_task_type"]))
    lines.append("")
    lines.extend(usage_lines(s["usage"]))
    if s.get("cost"):
        lines.append("")
        lines.extend(cost_lines(s["cost"]))
    lines.extend(failure_lines(s))
    return "\n".join(lines)


def usage_lines(usage: dict[str, Any]) -> list[str]:
    lines = ["LLM calls        calls  from log   prompt tok  completion tok"]
    for role, u in usage.items():
        served = u["calls"] - u["sent"]
        lines.append(f"  {role:12}{u['calls']:>8}{max(served, 0):>10}{_n(u['prompt_tokens']):>13}"
                     f"{_n(u['completion_tokens']):>16}")
    return lines


def task_type_lines(baseline: dict[str, Any], best: dict[str, Any]) -> list[str]:
    """Test results per task type, baseline and best side by side."""
    lines = [f"{'test by task type':24}{'n':>4}{'baseline':>10}{'best':>10}{'change':>9}"]
    for task in sorted(set(baseline) | set(best)):
        a, b = baseline.get(task, {}), best.get(task, {})
        change = f"{b['hard'] - a['hard']:+.3f}" if a and b else "-"
        lines.append(f"  {task:22}{(a or b).get('n', 0):>4}{fmt(a.get('hard')):>10}{fmt(b.get('hard')):>10}"
                     f"{change:>9}")
    return lines


def run_rows(store, rows) -> list[dict[str, Any]]:
    from skillstate.engine.runner import load_run

    out = []
    for row in rows:
        state = load_run(store, row.run_id).state
        out.append({
            "run_id": row.run_id, "parent_run_id": row.parent_run_id, "fork_step": row.fork_step,
            "created_at": row.created_at.isoformat() if row.created_at else None,
            "status": status_of(state), "baseline_score": state.baseline.gate if state.baseline else None,
            "best_score": state.best_score, "best_step": state.best_step,
        })
    return out


def event_summary(ev: Event) -> str:
    t = ev.type
    if t == "RunStarted":
        return f"{ev.total_steps} steps, dataset {ev.dataset_fingerprint[:12]}"
    if t == "RunForked":
        return f"from {ev.parent_run_id} at step {ev.fork_step}, overrides {json.dumps(ev.overrides)}"
    if t in ("BaselineEvaluated", "CandidateEvaluated", "TestEvaluated"):
        label = getattr(ev, "label", "")
        return f"{label + ' ' if label else ''}{ev.split} gate {fmt(ev.scores.gate)} hard {fmt(ev.scores.hard)}"
    if t == "StepStarted":
        return f"epoch {ev.epoch}, budget {ev.edit_budget}, {len(ev.batch_item_ids)} items"
    if t == "RolloutCompleted":
        return f"{sum(1 for r in ev.results if r.hard >= 1)}/{len(ev.results)} solved"
    if t == "PatchProposed":
        return f"{ev.source}#{ev.minibatch} {ev.status}, {len(ev.edits)} edits from {len(ev.item_ids)} items"
    if t == "PatchesMerged":
        return f"{len(ev.edits)} edits ({len(ev.merges)} merge calls)"
    if t == "EditsSelected":
        return f"{len(ev.edits)}/{ev.candidates} kept, budget {ev.budget}, {ev.method}"
    if t == "CandidateBuilt":
        return ", ".join(f"{r.op}:{r.status}" for r in ev.report) or "no edits"
    if t == "GateDecided":
        return f"{ev.decision}: {ev.reason}"
    if t == "LearningRateChosen":
        return f"apply {ev.chosen} of {ev.candidates} ({ev.status}{', asked ' + ev.requested if ev.requested else ''})"
    if t == "EpochCompared":
        counts: dict[str, int] = {}
        for lab in ev.labels.values():
            counts[lab] = counts.get(lab, 0) + 1
        return f"epoch {ev.epoch}: " + ", ".join(f"{n} {lab}" for lab, n in sorted(counts.items()))
    if t == "SlowUpdateProposed":
        return f"epoch {ev.epoch}: {ev.status}, {len(ev.guidance.splitlines())} guidance lines"
    if t == "SlowUpdateDecided":
        return f"epoch {ev.epoch}: {ev.decision}{' (forced)' if ev.forced else ''}: {ev.reason}"
    if t == "MetaSkillWritten":
        return f"epoch {ev.epoch}: {ev.status}, {len(ev.memo.splitlines())} memo lines"
    if t == "EpochEnded":
        return f"epoch {ev.epoch}"
    if t == "FinalValidated":
        verdict = "promoted to best" if ev.promoted else "best kept"
        return f"current {fmt(ev.score)} vs best {fmt(ev.best_score)}: {verdict}"
    if t == "RunCompleted":
        return f"best {fmt(ev.best_score)} at step {ev.best_step}"
    return ""


def why_text(info: dict[str, Any]) -> str:
    where = [name for name, key in (("initial", "in_initial_skill"), ("current", "in_current_skill"),
                                    ("best", "in_best_skill")) if info[key]]
    lines = [f"run {info['run_id']}: {info['text']!r} is in the "
             + (" and ".join(where) + " skill" if where else "no skill of this run (initial, current or best)")]
    for c in info["changes"]:
        where = (f"step {c['step']} (epoch {c['epoch']})" if c["by"] == "step"
                 else f"slow update at the end of epoch {c['epoch']}")
        lines.append(f"  {where}: {c['change']} by {c['decision']} ({c['reason']})")
    origin = info["origin"]
    if origin is None:
        if info["in_current_skill"] and info["in_initial_skill"]:
            lines.append("  it was in the initial skill and no accepted step removed it")
        return "\n".join(lines)
    if "slow_update_epoch" in origin:
        lines.append(f"the slow update of epoch {origin['slow_update_epoch']} wrote it into the guidance block, "
                     f"after comparing the epoch's skills on {sum(origin['comparison'].values())} train items "
                     f"({', '.join(f'{n} {k}' for k, n in sorted(origin['comparison'].items()))})")
        if origin["reasoning"]:
            lines.append(f"  reasoning: {origin['reasoning'][:200]}")
        return "\n".join(lines)
    lines.append(f"step {origin['step']} kept ({origin['method']}):")
    for e in origin["kept_edits"]:
        lines.append(f"  [{e['status'] or origin['method']}] {e['op']} ({e['source']}, support {e['support']}): "
                     f"{(e['content'] or e['target'])[:100]}")
    for p in origin["proposed_by"]:
        lines.append(f"proposed by the {p['source']} analyst, minibatch {p['minibatch']}:")
        for s in p["failure_summary"]:
            lines.append(f"  pattern: {s}")
        if p["reasoning"]:
            lines.append(f"  reasoning: {p['reasoning'][:200]}")
        for item in p["items"][:10]:
            reason = item["fail_reason"] or "solved"
            lines.append(f"  - {item['item_id']} [{item['task_type']}] {reason[:90]}")
        if len(p["items"]) > 10:
            lines.append(f"  ... {len(p['items']) - 10} more items")
    return "\n".join(lines)
