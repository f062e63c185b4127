"""Terminal text of a bank diff (`skillstate diff` of a skill-bank run): a
table of the skills added, dropped and refined, the common mistakes that
changed, then a unified diff of each refined skill's text."""

from __future__ import annotations

from typing import Any

from skillstate.cli.tables import Col, clip, table_lines


def bank_diff_lines(diff: dict[str, Any], label_a: str, label_b: str, width: int | None = None) -> list[str]:
    """The diff `skillstate.reading.bank_diff.bank_diff` computed, as lines fitted to `width`."""
    lines = [f"bank {label_a} -> {label_b}: {diff['size_before']} -> {diff['size_after']} skills; "
             f"{len(diff['added'])} added, {len(diff['dropped'])} dropped, {len(diff['refined'])} refined, "
             f"{diff['same']} unchanged"]
    rows: list[list[Any]] = []
    rows += [["added", s["id"], s["category"], s["title"], s["principle"]] for s in diff["added"]]
    rows += [["dropped", s["id"], s["category"], s["title"], s["principle"]] for s in diff["dropped"]]
    rows += [["refined", f"{r['before']['id']} -> {r['after']['id']}", r["after"]["category"], r["after"]["title"],
              r["after"]["principle"]] for r in diff["refined"]]
    rows += [["mistake +", "", "", m, ""] for m in diff["mistakes_added"]]
    rows += [["mistake -", "", "", m, ""] for m in diff["mistakes_dropped"]]
    if rows:
        lines.extend(table_lines([Col("change"), Col("skill", shrink=True), Col("category", shrink=True),
                                  Col("title", shrink=True), Col("principle", shrink=True)], rows, width))
    for r in diff["refined"]:
        lines.append("")
        lines.extend(clip(line, width) if width else line for line in r["diff"])
    return lines
