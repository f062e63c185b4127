"""Notes under a run's summary (run, resume, eval, show): what the tables
alone would let pass as a success, each said in plain words."""

from __future__ import annotations

from typing import Any

from skillstate.cli.tables import wrapped

TOOL_FIX = "a model that calls tools, served with tool calling on (llama.cpp: llama-server --jinja)"


def unrecorded_lines(usage: dict[str, Any], width: int) -> list[str]:
    """The sent calls no event uses: those that succeeded (unused) and those that failed, said apart."""
    lines = []
    unused = sum(u.get("unused", 0) for u in usage.values())
    if unused:
        lines.extend(wrapped(f"{unused} sent call{'s' * (unused != 1)} went unused (rollouts done ahead that the "
                             "gate made obsolete, calls in flight at an early reject)", width))
    failed = sum(u.get("failed_unrecorded", 0) for u in usage.values())
    if failed:
        lines.extend(wrapped(f"{failed} sent call{'s' * (failed != 1)} failed outside the recorded stages (in the "
                             "stage the run stopped in, which a resume redoes, or in work done ahead)", width))
    return lines


def tool_use_lines(s: dict[str, Any], width: int) -> list[str]:
    """A tool-using run whose target never called a tool, or wrote calls as text."""
    use = s.get("tool_use")
    if not use or not use.get("replies"):
        return []
    lines = [""]
    replies = f"{use['replies']} target repl{'ies' if use['replies'] != 1 else 'y'}"
    if not use["tool_calls"]:
        lines.extend(wrapped(f"warning: no tool was called in {replies}: the environment's tools never ran, so "
                             f"its scores say nothing about the skill; use {TOOL_FIX}", width))
    if use["text_tool_calls"]:
        n = use["text_tool_calls"]
        lines.extend(wrapped(f"warning: {n} of {replies} wrote a tool call as text ({{\"name\": ..., "
                             f"\"arguments\": ...}} in the content) that no tool ran; use {TOOL_FIX}", width))
    return lines if len(lines) > 1 else []


def trigger_lines(s: dict[str, Any], width: int) -> list[str]:
    """With progressive disclosure: how often the target loaded the trained skill (recall), how many of its skill
    loads were the expected skill (precision), and the files it read, per evaluation."""
    from skillstate.cli.tables import Col, fmt, table_lines

    if s.get("triggers_unobserved"):  # an external agent reads its skills as files: no load is seen
        return ["", *wrapped(f"skill triggers: not observed: the agent (harness {s['triggers_unobserved']}) reads "
                             "its skills as files, and the run does not see which it opens; the scores above "
                             "measure the skills it was given", width)]
    triggers = s.get("triggers")
    if not triggers:
        return []
    names = {"baseline": "initial skill", "test_baseline": "initial skill", "test_best": "best skill",
             "test_no_skill": "no skill",
             "test_eval": "skill"}
    rows = [[f"{names.get(label, label)} ({t['split']})", t["rollouts"], fmt(t["recall"]), fmt(t["precision"]),
             t["wrong_loads"], sum(t["files_read"].values())] for label, t in triggers.items()]
    lines = ["", *table_lines([Col("skill triggers", shrink=True), Col("rollouts", num=True), Col("recall", num=True),
                               Col("precision", num=True), Col("wrong loads", num=True), Col("file reads", num=True)],
                              rows, width)]
    if all(not t["loads"] for t in triggers.values()):
        lines.extend(wrapped("warning: the target never loaded a skill, so no score here measured one; check that "
                             "the endpoint serves tool calls, or use disclosure: inline", width))
    return lines
