"""Pruning, the pure part: which lines of a skill's body do not earn their
place by rule (exact and near duplicates of an earlier line), what each line
of the current skill is known to have done (the step that added it and that
step's gain), and the delete edits of a proposal.

The engine (`skillstate.engine.prune`) adds the optimizer's proposals (the
`prune` prompt) and decides the deletions through the gate."""

from __future__ import annotations

import re
from collections.abc import Sequence

from skillstate.log.events import Edit

DUPLICATE = "duplicate"
NEAR_DUPLICATE = "near_duplicate"
OPTIMIZER = "optimizer"
NEAR = 0.75  # token overlap (Jaccard) from which two lines say the same thing
_WORD = re.compile(r"[a-z0-9]+")


def content_lines(body: str) -> list[str]:
    """The body's lines a proposal may delete: not blank, not headings, not block markers."""
    return [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "<!--"))]


def words(line: str) -> frozenset[str]:
    return frozenset(_WORD.findall(line.lower()))


def _normal(line: str) -> str:
    return " ".join(_WORD.findall(line.lower()))


def similar(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether two lines' words overlap enough to say the same thing: a
    Jaccard overlap of at least NEAR, or the shorter (four words or more)
    held whole in the longer."""
    if not a or not b:
        return False
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return len(a & b) / len(a | b) >= NEAR or (len(small) >= 4 and small <= large)


def rule_deletions(body: str) -> list[tuple[str, str, str]]:
    """(line, reason, the earlier line it repeats) for each content line that
    repeats an earlier one exactly (up to case, punctuation and spacing) or
    nearly (`similar`); the earlier line is kept. In body order."""
    kept: list[tuple[str, str, frozenset[str]]] = []
    out: list[tuple[str, str, str]] = []
    for line in content_lines(body):
        norm, w = _normal(line), words(line)
        twin = next((k for k, n, _ in kept if n == norm and n), None)
        if twin is not None:
            out.append((line, DUPLICATE, twin))
            continue
        near = next((k for k, _, kw in kept if similar(w, kw)), None)
        if near is not None:
            out.append((line, NEAR_DUPLICATE, near))
            continue
        kept.append((line, norm, w))
    return out


def whole_line_first(body: str, line: str) -> bool:
    """Whether a delete edit of `line` removes that whole line: its first
    occurrence in `body` (where the editor deletes) is a whole line."""
    pos = body.find(line)
    end = pos + len(line)
    return pos >= 0 and (pos == 0 or body[pos - 1] == "\n") and (end == len(body) or body[end] == "\n")


def deletion_edits(lines: Sequence[str]) -> list[Edit]:
    return [Edit(op="delete", target=line, content="", source="prune", support=0) for line in lines]


def line_evidence(initial: str, changes: Sequence[tuple[int, float, str]], body: str) -> list[dict]:
    """Each content line of `body`: the step whose accepted skill first held
    it (None: the initial skill) and that step's gain over the skill before.
    `changes`: (step, gain, the skill's text) of each accepted change, in order."""
    seen: dict[str, tuple[int, float]] = {}
    before = set(initial.splitlines())
    for step, gain, text in changes:
        lines = text.splitlines()
        for ln in lines:
            if ln not in before and ln not in seen:
                seen[ln] = (step, gain)
        before = set(lines) | before
    out = []
    for ln in content_lines(body):
        step_gain = seen.get(ln) if ln not in set(initial.splitlines()) else None
        out.append({"line": ln, "added_at_step": step_gain[0] if step_gain else None,
                    "gain": round(step_gain[1], 4) if step_gain else None})
    return out
