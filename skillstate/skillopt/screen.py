"""Screening: which proposed edits to leave out before selection. Pure.

Before selection every candidate edit is dry-run against the current skill,
so the edit budget is spent only on edits that change something (and, when
asked, that have not failed before). An edit is dropped, with its reason,
when:
- `already_in_skill`: an append or insert (or, in rewrite mode, a
  suggestion) whose every line the skill already holds, compared after
  normalizing case, whitespace and a leading list marker;
- `target_absent` / `empty_target`: a replace or delete whose target is not
  in the skill's editable body, or empty;
- `protected_block`: a replace or delete whose target is only in the
  protected slow-update block;
- `no_change`: a replace whose content equals its target;
- `duplicate`: the same edit as an earlier one in the patch;
- `unknown_op`: an op the editor does not know;
- `no_front_matter` / `invalid_description` / `no_change`: a `describe`
  edit (only where the run takes them, `front` given) on a skill without a
  front matter, with a description that is not one line of 1 to 1,024
  characters, or the description the skill already has;
- `another_describe`: a `describe` edit after one already kept (each sets
  the whole description, so a later one would overwrite the first: a
  candidate gets one description, the first the merge ranks);
- `rejected_before` (only with `drop_rejected_edits` N > 0): the same edit
  was in N or more rejected candidates of the run, or was dropped by the
  repair as harmful (each counts once).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from skillstate.log.events import DroppedEdit, Edit
from skillstate.skillopt.describe import DESCRIBE, describe_status

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


def edit_key(edit: Edit) -> tuple[str, str, str]:
    """An edit as compared with earlier ones: its op, and its target and content normalized."""
    return _key(edit.keyed_op, edit.target, edit.content)


def _key(op: str, target: str, content: str) -> tuple[str, str, str]:
    return (op, normalize_line(target), " ".join(_lines(content)))


def normalized_counts(raw: Mapping[tuple[str, str, str], int]) -> dict[tuple[str, str, str], int]:
    """(op, target, content) -> count, as the log counts them, keyed by `edit_key` (counts of edits that
    normalize alike add up)."""
    out: dict[tuple[str, str, str], int] = {}
    for (op, target, content), n in raw.items():
        k = _key(op, target, content)
        out[k] = out.get(k, 0) + n
    return out


def screen_edits(body: str, block: str, edits: list[Edit],
                 rejected: Mapping[tuple[str, str, str], int] | None = None,
                 max_rejections: int = 0, front: str | None = None) -> tuple[list[int], list[DroppedEdit]]:
    """(indexes of the edits kept, the dropped ones with their reasons), for a
    skill whose editable text is `body` and whose protected block is `block`.
    With `max_rejections` N > 0, an edit that was in N or more rejected
    candidates of the run (`rejected`: (op, target, content) -> count, as
    the fold keeps them) is dropped as `rejected_before`. `front`: the
    skill's front matter where the run takes `describe` edits (None: it
    does not, and they are unknown ops)."""
    held = set(_lines(body))
    counts = normalized_counts(rejected) if rejected and max_rejections > 0 else {}
    whole = " ".join(_lines(body))
    kept: list[int] = []
    dropped: list[DroppedEdit] = []
    seen: set[tuple[str, str, str]] = set()
    for i, edit in enumerate(edits):
        key = edit_key(edit)
        reason = (describe_reason(edits, i, kept, front) if front is not None and edit.op == DESCRIBE
                  else _reason(edit, body, block, held, whole))
        if reason is None and key in seen:
            reason = "duplicate"
        if reason is None and counts and counts.get(key, 0) >= max_rejections:
            reason = "rejected_before"
        if reason is None:
            seen.add(key)
            kept.append(i)
        else:
            dropped.append(DroppedEdit(index=i, reason=reason))
    return kept, dropped


def describe_reason(edits: list[Edit], index: int, kept: list[int], front: str) -> str | None:
    """Why the `describe` edit `edits[index]` is dropped (None: kept), with `kept` the edits kept before it."""
    return describe_status(front, edits[index].content) or (
        "another_describe" if any(edits[k].op == DESCRIBE for k in kept) else None)


def screen_describes(edits: list[Edit], front: str) -> tuple[list[int], list[DroppedEdit]]:
    """`screen_edits` for `describe` edits alone (with drop_noop_edits off every other edit is kept): one
    description per candidate, valid and new."""
    kept: list[int] = []
    dropped: list[DroppedEdit] = []
    for i, edit in enumerate(edits):
        reason = describe_reason(edits, i, kept, front) if edit.op == DESCRIBE else None
        if reason is None:
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
