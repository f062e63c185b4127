"""The review as `skillstate review` prints it (`skillstate.reading.review.review_view` gives the data)."""

from __future__ import annotations

from typing import Any

from skillstate.cli.tables import Col, fmt, output_width, shorten, table_lines, text_block, wrapped


def _usd(value: float) -> str:
    return f"${value:,.4f}"


def review_text(view: dict[str, Any], width: int | None = None) -> str:
    width = output_width() if width is None else width
    v = view["verdict"]
    state = "awaits review" if view["waiting"] else "was reviewed"
    lines = [f"run {view['run_id']}, step {view['step']} {state} (review: {view['review']}; requested "
             f"{view['requested_at']})"]
    lines += wrapped(f"the gate: {v['decision']} ({v['reason']})", width)
    sc, cur = view["scores"], view["current_scores"]
    part = view["partial"]
    scored = (f"rejected early after {part['scored']} of {part['of']} items, at most {fmt(part['upper_bound'])}"
              if part else f"{sc['n']} items")
    current = f"; current skill gate {fmt(cur['gate'])}" if cur else ""
    lines.append(f"{view['split']}: candidate gate {fmt(sc['gate'])} (hard {fmt(sc['hard'])}, soft {fmt(sc['soft'])}, "
                 f"{scored}){current}")
    if view["types"]:
        rows = []
        for t in view["types"]:
            change = (f"{t['candidate'] - t['current']:+.3f}" if t["candidate"] is not None
                      and t["current"] is not None else "")
            rows.append([t["task_type"], t["n"], fmt(t["current"]), fmt(t["candidate"]), change])
        lines.append("")
        lines += table_lines([Col("task type", shrink=True), Col("n", num=True), Col("current", num=True),
                              Col("candidate", num=True), Col("change", num=True)], rows, width)
    for f in view["files"]:
        lines += ["", f"diff of {f['path']}:", *f["diff"].rstrip("\n").splitlines()]
    if not view["files"]:
        lines += ["", "the candidate changes no file"]
    edits = view["edits"]
    if edits:
        how = "; leave some out with --approve --drop N" if view["droppable"] and view["waiting"] else ""
        lines += ["", f"edits the candidate applies ({len(edits)}{how}):"]
    for e in edits:
        file = f"{e['file']}, " if e.get("file") else ""
        origin = {"trimmed": ", kept by the repair without a clause", "blocker": ", the blocker search's"}.get(
            e["origin"], "")
        head = (f"  {e['number']}. [{e['status'] or '?'}] {e['op']} ({file}{e['source']}, support "
                f"{e['support']}{origin}): ")
        lines += text_block(head, e["content"] or e["target"], width)
        if e["target"] and e["content"]:
            lines += wrapped(f"     at: {shorten(e['target'], 200)}", width, "       ")
        if e.get("blocker"):
            b = e["blocker"]
            lines += wrapped(f"     the line held {b['task_type']} down: without it its {b['items']} failed items "
                             f"gained {b['lifted']:+g}", width, "       ")
        for p in e["proposed_by"]:
            lines.append(f"     proposed by the {p['source']} analyst, minibatch {p['minibatch']}:")
            for s in p["failure_summary"]:
                lines += wrapped(f"       pattern: {shorten(s, 300)}", width, "         ")
            if p["reasoning"]:
                lines += wrapped(f"       reasoning: {shorten(p['reasoning'], 300)}", width, "         ")
            for item in p["items"][:6]:
                reason = item["fail_reason"] or "solved"
                lines += wrapped(f"       - {item['item_id']} [{item['task_type']}] {shorten(reason, 160)}", width,
                                 "         ")
            if len(p["items"]) > 6:
                lines.append(f"       ... {len(p['items']) - 6} more items")
        if not e["proposed_by"] and e["origin"] != "blocker":
            lines.append("     (no analyst's patch holds this text as is: the merge wrote it)")
    cost = view["cost"]
    lines += ["", f"cost: this step {_usd(cost['step'])}; the run so far {_usd(cost['run'])} (paid "
                  f"{_usd(cost['paid'])})" + (" at list prices" if not cost["unpriced_models"] else
                                               f"; no price for {', '.join(cost['unpriced_models'])}")]
    if view["timeout"] and view["waiting"]:
        t = view["timeout"]
        lines.append(f"review_timeout {t['seconds']:g} s: without a decision by then, {t['default']} is recorded")
    d = view["decision"]
    if d is not None:
        note = f": {d['comment']}" if d["comment"] and d["reviewer"] != "timeout" else ""
        lines += wrapped(f"decision: {d['text']} at {d['at']}{note}", width)
    return "\n".join(lines)
