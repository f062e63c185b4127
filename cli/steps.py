"""`skillstate show --step N`: everything the log says about one step."""

from __future__ import annotations

from typing import Any

from skillstate.cli.render import failed_calls_table, fmt
from skillstate.cli.tables import Col, clip, one_line, output_width, table_lines, wrapped


def step_text(d: dict[str, Any], width: int | None = None) -> str:
    """All of one step, fitted to `width` (default: the output's width):
    sentences fold, lists are tables or lines cut with an ellipsis."""
    width = output_width() if width is None else width

    def item(label: str, text: str) -> str:  # one entry of a list, indented, cut to the width
        return clip(f"  {label}: {one_line(text)}", width)

    budget = "" if "bank_label" in d else f"budget {d.get('edit_budget')}, "  # a bank step edits no document
    lines = wrapped(f"run {clip(d['run_id'], max(width - 5, 8))} step {d['step']} (epoch {d.get('epoch')}, "
                    f"{budget}{len(d.get('batch', []))} items)", width)
    if "bank_label" in d:
        lines.extend(wrapped(f"bank step: {d['bank_label']}", width))
    if "parent" in d:  # parent_selection pareto
        par = d["parent"]
        lines.extend(wrapped(f"parent: {par['skill'][:12]} (val {fmt(par['score'])}), "
                             f"{'switched' if par['switched'] else 'the current skill'}: {par['reason']}", width))
        for m in par["front"]:
            lines.append(item(f"front {m['skill'][:12]} (val {fmt(m['score'])})", "leads " + ", ".join(m["types"])))
    if "rollout" in d:
        r = d["rollout"]
        lines.append(f"rollout: {r['solved']}/{r['items']} solved")
        if r["failures"]:
            lines.extend(table_lines([Col("failed item", shrink=True), Col("task type", shrink=True),
                                      Col("reason", shrink=True)],
                                     [[f["item_id"], f["task_type"], f["fail_reason"]] for f in r["failures"][:8]],
                                     width, indent=2))
        if len(r["failures"]) > 8:
            lines.append(f"  ... {len(r['failures']) - 8} more failures")
        if r.get("graded"):  # env evals: every check of every item, with its verdict and evidence
            rows = [[g["item_id"], "pass" if c["passed"] else "FAIL" if c["passed"] is False else "-", c["text"],
                     one_line(c["evidence"])] for g in r["graded"] for c in g["checks"]]
            lines.extend(table_lines([Col("item", shrink=True), Col("verdict"), Col("check", shrink=True),
                                      Col("evidence", shrink=True)], rows, width, indent=2))
    for p in d.get("patches", []):
        failed = f": {p['error']}" if p.get("error") else ""
        lines.extend(wrapped(f"patch {p['source']}#{p['minibatch']} ({len(p['items'])} items): {p['status']}{failed}",
                             width))
        for s in p["failure_summary"]:
            lines.append(item("pattern", s))
        for e in p["edits"]:
            lines.append(item(e["op"], e["content"] or e["target"]))
    if "merged" in d:
        lines.append(f"merged: {len(d['merged']['edits'])} edits, {len(d['merged']['merge_calls'])} merge calls")
    if "learning_rate" in d:
        lr = d["learning_rate"]
        lines.extend(wrapped(f"learning rate (autonomous): apply {lr['chosen']} of {lr['candidates']} "
                             f"({lr['status']}{', asked ' + lr['requested'] if lr['requested'] else ''})", width))
    if "selected" in d:
        s = d["selected"]
        paired = s.get("paired") or []
        lines.extend(wrapped(f"selected ({s['method']}, budget {s['budget']}): {len(s['edits'])} of {s['candidates']}"
                             + (f", {len(s['dropped'])} left out" if s["dropped"] else "")
                             + (f", {len(paired)} kept with the link to {'them' if len(paired) > 1 else 'it'}"
                                if paired else ""), width))
        for dr in s["dropped"]:
            what = dr.get("content") or dr.get("target") or ""
            lines.append(clip(f"  dropped ({dr['reason'].replace('_', ' ')}): {dr.get('op', '')} {what}", width))
        report = d.get("apply_report", [])
        files = any("file" in e for e in s["edits"])  # a skill directory's run: the file each edit changes
        rows = [[report[i]["status"] if i < len(report) else "kept", e["op"], *([e.get("file", "")] if files else []),
                 e["source"], e["support"], e["content"] or e["target"]] for i, e in enumerate(s["edits"])]
        if rows:
            lines.extend(table_lines([Col("status"), Col("op"), *([Col("file")] if files else []), Col("source"),
                                      Col("support", num=True), Col("edit", shrink=True)], rows, width, indent=2))
    for key in ("distilled", "validated", "evolved"):  # the bank's stages, in their order
        if key == "validated" and key in d:
            v = d[key]
            per = ", ".join(f"{t} {fmt(r)}" for t, r in sorted(v["by_category"].items()))
            lines.extend(wrapped(f"validated on {v['split']}: gate {fmt(v['gate'])}; {per}", width))
        elif key in d:
            b = d[key]
            if key == "evolved":
                weak = ", ".join(f"{t} {fmt(b['rates'][t])}" for t in b["categories"]) or "none"
                lines.extend(wrapped(f"evolve: categories below the threshold: {weak}", width))
            label = {"distilled": "distill", "evolved": "evolve"}[key]
            lines.append(f"{label} ({b['status']}): {len(b['added'])} skills added, {len(b['dropped'])} dropped")
            for x in b["added"]:
                refined = f" (refines {x['refines']})" if x["refines"] else ""
                lines.append(item(f"added {x['category'] or 'general'}", f"{x['title']}: {x['principle']}{refined}"))
            for x in b["dropped"]:
                lines.append(item(f"dropped ({x['reason'].replace('_', ' ')})", f"{x['title']}: {x['principle']}"))
    if d.get("update", {}).get("method", "patch") != "patch":
        u = d["update"]
        changed = "changed" if d["candidate_changed"] else "unchanged"
        lines.append(f"update: {u['method']} ({u['status']}), skill {changed}")
    if "checked" in d:  # minibatch_gate
        c = d["checked"]
        lines.extend(wrapped(f"minibatch gate: candidate {c['candidate_total']:g}, parent {c['parent_total']:g} on "
                             f"the step's {c['items']} items: {'passed' if c['passed'] else 'rejected'}", width))
    if "evaluation" in d:
        lines.extend(wrapped("candidate " + evaluation_text(d["evaluation"]), width))
    if "repair" in d:
        lines.extend(repair_lines(d["repair"], width))
    if "blocker" in d:
        lines.extend(blocker_lines(d["blocker"], width))
    if "review" in d:  # review: what the gate decided, and the person after it
        r = d["review"]
        lines.extend(wrapped(f"review ({r['review']}): the gate's verdict {r['verdict']} ({r['reason']})", width))
        if r.get("decision"):
            without = f" without edit {', '.join(map(str, r['dropped']))}" if r["dropped"] else ""
            note = f": {r['comment']}" if r["comment"] and r["reviewer"] != "timeout" else ""
            lines.extend(wrapped(f"  {r['decision']}{without} by {r['reviewer']} at {r['at']}{note}", width, "    "))
            if r.get("evaluation"):
                lines.extend(wrapped("  rebuilt candidate " + evaluation_text(r["evaluation"]), width, "    "))
        else:
            lines.append(f"  awaits a decision: skillstate review {d['run_id']}")
    if "decision" in d:
        lines.extend(wrapped(f"gate: {d['decision']['decision']} ({d['decision']['reason']})", width))
        lines.extend(verdict_lines(d["decision"], width))
    f = d.get("failed_calls") or {}
    if f.get("by_stage"):
        lines.extend(failed_calls_table(f["by_stage"], width, title="failed calls"))
    return "\n".join(lines)


def evaluation_text(ev: dict[str, Any]) -> str:
    """A candidate's evaluation: its scores, or, rejected early, how far it got and the most it could score."""
    cache = " (score cache)" if ev["cached"] else ""
    p = ev.get("partial")
    if p:
        return (f"on {ev['split']}: rejected early after {p['scored']} of {p['of']} items, at most "
                f"{fmt(p['upper_bound'])} (on those {p['scored']}: hard {fmt(ev['hard'])} soft {fmt(ev['soft'])})"
                + cache)
    return f"on {ev['split']}: hard {fmt(ev['hard'])} soft {fmt(ev['soft'])} gate {fmt(ev['gate'])}" + cache


def verdict_lines(dec: dict[str, Any], width: int) -> list[str]:
    """The robust gate rules' verdicts (gate_rule paired, gate_type_margin), one line each."""
    lines = []
    at_best = " (the best the unscored items could give)"
    if dec.get("paired"):
        p = dec["paired"]
        lines.extend(wrapped(f"  paired test: {p['wins']} won, {p['losses']} lost, {p['ties']} tied; p "
                             f"{p['p_value']:.4g} vs {1 - p['confidence']:.4g}: {'pass' if p['passed'] else 'fail'}"
                             + (at_best if p["bound"] else ""), width))
    if dec.get("type_guard"):
        g = dec["type_guard"]
        losses = ", ".join(f"{t} {loss:+.4f}" for t, loss in g["losses"].items())
        lines.extend(wrapped(f"  type guard (margin {g['margin']:g}, loss per type): {losses}: "
                             f"{'pass' if g['passed'] else 'fail'}" + (at_best if g["bound"] else ""), width))
    return lines


def _verdict(a: dict[str, Any]) -> str:
    """An ablation's verdict: the edit dropped, the clause left out of it, or kept."""
    if a.get("trimmed"):
        return "clause left out"
    return "dropped" if a["dropped"] else "kept"


def blocker_lines(b: dict[str, Any], width: int) -> list[str]:
    """The blocker search: why it found a line or none, the edit it put back, the candidate it built."""
    lines = wrapped(f"blocker search: {b['reason']}", width)
    if b["screened"]:
        s = b["screened"]
        lines.extend(wrapped(f"  put back (left out by the screen): {s['op']} {s['content'] or s['target']}", width))
    if "evaluation" in b:
        lines.extend(wrapped("  candidate without the line " + evaluation_text(b["evaluation"]), width))
    return lines


def repair_lines(r: dict[str, Any], width: int) -> list[str]:
    """The repair (repair: ablate): the types lost, each ablated edit, the repaired candidate's score."""
    lines = wrapped(f"repair: {r['reason']}", width)
    if r["affected_types"]:
        lines.extend(wrapped(f"  lost: {', '.join(r['affected_types'])} ({r['items']} items: current "
                             f"{fmt(r['current_score'])}, candidate {fmt(r['candidate_score'])})", width))
    rows = [[_verdict(a), a["index"] if a.get("part") is None else f"{a['index']}.{a['part']}", fmt(a["score"]),
             f"{a['recovered']:+g}", a["content"] or a["target"]] for a in r["ablations"]]
    if rows:
        lines.extend(table_lines([Col("verdict"), Col("edit[.clause]", num=True), Col("without it", num=True),
                                  Col("recovered", num=True), Col("content", shrink=True)], rows, width, indent=2))
    if "evaluation" in r:
        lines.extend(wrapped("  repaired candidate " + evaluation_text(r["evaluation"]), width))
    return lines
