"""Clauses: the separate instructions one edit's text may join.

An optimizer often writes two instructions into one edit: two sentences,
two clauses joined by a semicolon, or two bullet lines. When one of them
helps and the other does harm, keeping or dropping the edit whole loses
either way. The repair (`repair_clauses`) therefore also tries an edit
without one of its clauses. These functions cut a text into clauses and
put it back together without one of them, keeping its line structure and
list markers. Pure and deterministic (property-tested in tests/test_repair_clauses.py).

A clause ends at a semicolon followed by a space, at a sentence end (`.`,
`!` or `?`) followed by a space and a capital letter, or at a line break.
Headings and blank lines are not clauses: they are kept as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MARKER = re.compile(r"^(\s*(?:[-*+]|\d+[.)])\s+)")
_CUT = re.compile(r"(?<=;)\s+|(?<=[.!?])\s+(?=[A-Z])")
_PLAIN = re.compile(r"^\s*(#|<!--|$)")


@dataclass(frozen=True)
class _Line:
    marker: str  # the list marker and its spaces ("- "), or ""
    parts: tuple[str, ...]  # the clauses; empty for a line kept as it is (a heading, a blank line)
    raw: str


def _lines(text: str) -> list[_Line]:
    out = []
    for raw in text.split("\n"):
        if _PLAIN.match(raw):
            out.append(_Line("", (), raw))
            continue
        match = _MARKER.match(raw)
        marker = match.group(1) if match else ""
        body = raw[len(marker):].strip()
        parts = tuple(p.strip() for p in _CUT.split(body) if p.strip())
        out.append(_Line(marker, parts, raw) if parts else _Line("", (), raw))
    return out


def clauses(text: str) -> list[str]:
    """The clauses of `text`, in order (each without its list marker)."""
    return [part for line in _lines(text) for part in line.parts]


def _sentence(parts: list[str]) -> str:
    """Clauses joined back into one line's text: the first capitalised, a
    trailing semicolon turned into a full stop."""
    joined = " ".join(parts).strip()
    if joined.endswith(";"):
        joined = joined[:-1].rstrip() + "."
    return joined[:1].upper() + joined[1:]


def without(text: str, k: int) -> str:
    """`text` without its clause `k` (0-based, as `clauses` counts them).
    A line left with no clause is removed with its line break; the other
    lines are kept byte for byte. Raises IndexError for a `k` out of range."""
    lines = _lines(text)
    count = sum(len(line.parts) for line in lines)
    if not 0 <= k < count:
        raise IndexError(f"clause {k} of {count}")
    out: list[str] = []
    seen = 0
    for line in lines:
        if seen <= k < seen + len(line.parts):
            rest = [p for j, p in enumerate(line.parts) if j != k - seen]
            if rest:
                out.append(line.marker + _sentence(rest))
        else:
            out.append(line.raw)
        seen += len(line.parts)
    return "\n".join(out)
