"""Screening: which proposed edits would change nothing. Pure.

Before selection every candidate edit is dry-run against the current skill,
so the edit budget is spent only on edits that change something. An edit is
dropped, with its reason, when:
- `already_in_skill`: an append or insert (or, in rewrite mode, a
  suggestion) whose every line the skill already holds, compared after
  normalizing case, whitespace and a leading list marker;
- `target_absent` / `empty_target`: a replace or delete whose target is not
  in the skill's editable body, or empty;
- `protected_block`: a replace or delete whose target is only in the
  protected slow-update block;
- `no_change`: a replace whose content equals its target;
- `duplicate`: the same edit as an earlier one in the patch;
- `unknown_op`: an op the editor does not know.
"""

from __future__ import annotations

import re

from skillstate.log.events import DroppedEdit, Edit

_MARKER = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def normalize_line(line: str) -> str:
    """A line as compared: no list marker, lower case, single spaces."""
    return " ".join(_MARKER.sub("", line).lower().split())


def _lines(text: str) -> list[str]:
    return [n for n in (normalize_line(line) for line in text.splitlines()) if n]


def _held(content: str, held: set[str], whole: str | None) -> bool:
    """Whether the skill already holds every line of `content` (with `whole`,
    the normalized skill, a suggestion contained in a longer line counts)."""
    lines = _lines(content)
    return bool(lines) and all(line in held or (whole is not None and line in whole) for line in lines)


def screen_edits(body: str, block: str, edits: list[Edit]) -> tuple[list[int], list[DroppedEdit]]:
    """(indexes of the edits kept, the dropped ones with their reasons), for a
    skill whose editable text is `body` and whose protected block is `block`."""
    held = set(_lines(body))
    whole = " ".join(_lines(body))
    kept: list[int] = []
    dropped: list[DroppedEdit] = []
    seen: set[tuple[str, str, str]] = set()
    for i, edit in enumerate(edits):
        key = (edit.op, normalize_line(edit.target), " ".join(_lines(edit.content)))
        reason = _reason(edit, body, block, held, whole)
        if reason is None and key in seen:
            reason = "duplicate"
        if reason is None:
            seen.add(key)
            kept.append(i)
        else:
            dropped.append(DroppedEdit(index=i, reason=reason))
    return kept, dropped


def _reason(edit: Edit, body: str, block: str, held: set[str], whole: str) -> str | None:
    op = edit.op
    if op in ("append", "insert_after", "suggest"):
        if not edit.content.strip():
            return "empty_content"
        return "already_in_skill" if _held(edit.content, held, whole if op == "suggest" else None) else None
    if op in ("replace", "delete"):
        if not edit.target:
            return "empty_target"
        if edit.target not in body:
            return "protected_block" if block and edit.target in block else "target_absent"
        if op == "replace" and edit.content == edit.target:
            return "no_change"
        return None
    return "unknown_op"
