"""Update: apply edits to a skill text. Pure and deterministic.

Ops (SkillOpt semantics):
- append: add `content` at the end.
- insert_after: insert `content` after the first line holding `target`;
  when the target is empty or absent, append instead.
- replace: replace the first occurrence of `target` with `content`;
  skipped when the target is empty or absent.
- delete: remove the first occurrence of `target` (and the line break after
  it when the target is a whole line); skipped when empty or absent.
Unknown ops are skipped. Every edit gets a status in the apply report, and
the status says whether the text changed: `applied` and `appended` always
change it, every other status leaves it as it was.
"""

from __future__ import annotations

from collections.abc import Iterable

from skillstate.log.events import ApplyEntry, Edit

CHANGED = {"applied", "appended"}
OPS = ("append", "insert_after", "replace", "delete")


def _append(text: str, content: str) -> str:
    if not content:
        return text
    sep = "\n" if text and not text.endswith("\n") else ""
    return text + sep + content


def _insert_after(text: str, target: str, content: str) -> tuple[str, bool]:
    """Returns (new text, whether the target line was found)."""
    if not target:
        return text, False
    pos = text.find(target)
    if pos < 0:
        return text, False
    line_end = text.find("\n", pos + len(target))
    if line_end < 0:
        return text + "\n" + content, True
    return text[: line_end + 1] + content + ("" if content.endswith("\n") else "\n") + text[line_end + 1 :], True


def _delete(text: str, target: str) -> str:
    pos = text.find(target)
    end = pos + len(target)
    whole_line = (pos == 0 or text[pos - 1] == "\n") and end < len(text) and text[end] == "\n"
    if whole_line and not target.endswith("\n"):
        end += 1
    return text[:pos] + text[end:]


def apply_edit(text: str, edit: Edit) -> tuple[str, str]:
    """Apply one edit; returns (new text, status)."""
    op, target, content = edit.op, edit.target, edit.content
    if op == "append":
        new = _append(text, content)
        return (new, "appended") if new != text else (text, "unchanged")
    if op == "insert_after":
        if not content:
            return text, "unchanged"
        new, found = _insert_after(text, target, content)
        if not found:
            new = _append(text, content)
            return (new, "appended") if new != text else (text, "unchanged")
        return (new, "applied") if new != text else (text, "unchanged")
    if op in ("replace", "delete"):
        if not target:
            return text, "skipped_empty_target"
        if target not in text:
            return text, "skipped_absent"
        new = text.replace(target, content, 1) if op == "replace" else _delete(text, target)
        return (new, "applied") if new != text else (text, "unchanged")
    return text, "skipped_unknown_op"


def apply_edits(text: str, edits: Iterable[Edit]) -> tuple[str, list[ApplyEntry]]:
    """Apply edits in order; returns the new text and the apply report."""
    report: list[ApplyEntry] = []
    for index, edit in enumerate(edits):
        text, status = apply_edit(text, edit)
        report.append(ApplyEntry(index=index, op=edit.op, status=status))
    return text, report
