"""Reading an optimizer request that is laid out in markdown sections.

skillstate's own prompts put their material between tags (`<skill>`,
`<failures>`, ...), and `SimOptimizer.reply` reads those. Other programs lay
the same material out under markdown headings: a "Current Skill" section,
then the trajectories an analyst should read, or the patches to merge, or a
numbered pool of edits to rank. This module finds that material by what it
is (a skill, tasks with their outcome, JSON patches, an indexed edit list),
so the simulated optimizer answers such a request from its content, the way
it answers skillstate's.

`read_request` returns an `OptimizerRequest`, or None when the text is not
an optimizer request of this layout (then it is the target's).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

# A heading that opens the skill section, and the headings that close it: the
# sections of evidence an optimizer is shown after the skill.
_SKILL_HEADING = re.compile(r"^#{1,3} [^\n]*\bskill\b[^\n]*$", re.IGNORECASE | re.MULTILINE)
_EVIDENCE_HEADING = re.compile(r"^## [^\n]*(budget|trajector|patch|edit|group|additional context)[^\n]*$",
                               re.IGNORECASE | re.MULTILINE)
_BLOCK = re.compile(r"^### ", re.MULTILINE)
_POOL_LINE = re.compile(r"^\[(\d+)\] op=(\S+)(.*)$", re.MULTILINE)
_QUOTED = r"""('(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?)"""


@dataclass
class OptimizerRequest:
    """What an optimizer request shows, whatever its wording."""

    kind: str  # "failures" | "successes" | "patches" | "edits"
    skill: str
    budget: int | None = None
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)
    edits: list[dict[str, Any]] = field(default_factory=list)


def read_request(text: str, world: Any) -> OptimizerRequest | None:
    heading = _SKILL_HEADING.search(text)
    if heading is None:
        return None
    sections = list(_EVIDENCE_HEADING.finditer(text, heading.end()))
    if not sections:
        return None
    skill = text[heading.end():sections[0].start()].strip("\n")
    budget = _budget(text)
    for i, section in enumerate(sections):
        title = section.group(0).lower()
        body = text[section.end():sections[i + 1].start() if i + 1 < len(sections) else len(text)]
        if "trajector" in title:
            read = (_trajectory(block, title, world) for block in _BLOCK.split(body)[1:])
            trajectories = [t for t in read if t is not None]
            if not trajectories:
                return None
            kind = "failures" if any(not t["hard"] for t in trajectories) else "successes"
            if kind == "failures":
                trajectories = [t for t in trajectories if not t["hard"]]
            return OptimizerRequest(kind, skill, budget, trajectories=trajectories)
        if "edit" in title and _POOL_LINE.search(body):
            return OptimizerRequest("edits", skill, budget, edits=_edit_pool(body))
        if "patch" in title or "group" in title:
            patches = _json_list(body)
            if patches is not None:
                return OptimizerRequest("patches", skill, budget, patches=[p for p in patches if isinstance(p, dict)])
    return None


def _budget(text: str) -> int | None:
    match = re.search(r"budget\s*=\s*(\d+)|at most (\d+) edits|select the (\d+) most", text, re.IGNORECASE)
    return int(next(g for g in match.groups() if g)) if match else None


def _trajectory(block: str, title: str, world: Any) -> dict[str, Any] | None:
    """One task an analyst is shown: its outcome, and its task type, found
    from the question itself when the world knows it; None for a block that
    shows neither a question nor an outcome (a heading inside a quoted skill)."""
    hard = re.search(r"\bhard\s*=\s*([0-9.]+)", block)
    question = re.search(r"^Question:\s*(.+)$", block, re.MULTILINE)
    if hard is None and question is None:
        return None
    outcome = float(hard.group(1)) >= 1 if hard else "success" in title
    item = world.find_item(f"Question: {question.group(1)}") if question and hasattr(world, "find_item") else None
    stated = re.search(r"^Task type:\s*(.+)$", block, re.MULTILINE)
    task_type = item.get("task_type", "") if item else (stated.group(1).strip() if stated else "")
    return {"hard": outcome, "task_type": task_type, "question": question.group(1).strip() if question else ""}


def _json_list(body: str) -> list[Any] | None:
    start = body.find("[")
    while start != -1:
        try:
            value, _ = json.JSONDecoder().raw_decode(body, start)
        except json.JSONDecodeError:
            start = body.find("[", start + 1)
            continue
        return value if isinstance(value, list) else None
    return None


def _field(rest: str, name: str) -> str:
    match = re.search(rf"\b{name}={_QUOTED}", rest)
    if not match:
        return ""
    literal = match.group(1)
    try:
        return str(ast.literal_eval(literal))
    except (ValueError, SyntaxError):  # cut short by the caller ("..."): keep what is there
        return literal.strip("'\"")


def _edit_pool(body: str) -> list[dict[str, Any]]:
    return [{"index": int(m.group(1)), "op": m.group(2), "target": _field(m.group(3), "target"),
             "content": _field(m.group(3), "content")} for m in _POOL_LINE.finditer(body)]
