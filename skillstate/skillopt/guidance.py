"""The slow-update block and the epoch comparison. Pure functions.

The slow update's guidance lives in one protected block at the end of the
skill, between two markers. Step updates never see it: they edit the body
(the skill without the block) and the block is put back unchanged, whatever
the edits, the rewrite call or the full-rewrite analysts did to the text.

An Agent Skills `SKILL.md` opens with a YAML front matter (its `name` and
`description`, which agents read to decide when to load it). It is
protected the same way: the body leaves it out, and the skill's own front
matter is put back before the body, so no edit can break it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from skillstate.errors import UserError
from skillstate.skilltree.frontmatter import parse_front_matter

START = "<!-- SLOW_UPDATE_START -->"
END = "<!-- SLOW_UPDATE_END -->"
_BLOCK = re.compile(re.escape(START) + r"\n?(.*?)\n?" + re.escape(END) + r"\n?", re.DOTALL)

LABELS = ("regressed", "improved", "persistent_fail", "stable_success")
POLICIES = {
    "mixed": set(LABELS),
    "changed": {"improved", "regressed"},
    "unchanged": {"persistent_fail", "stable_success"},
}


def guidance_of(skill: str) -> str | None:
    """The text of the first complete block, or None when there is none."""
    match = _BLOCK.search(skill)
    return match.group(1) if match else None


def strip_markers(text: str) -> str:
    """`text` with no marker left, also none re-formed from fragments
    (removing one marker may join the text around it into another)."""
    while START in text or END in text:
        text = text.replace(START, "").replace(END, "")
    return text


_FENCED = re.compile(r"---[ \t]*\r?\n.*?^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)


def front_of(skill: str) -> str:
    """The front matter that opens `skill`, its fences included, exactly as
    written; "" when the skill does not open with one that reads as a
    non-empty YAML mapping (a markdown document that starts with a rule
    line keeps it in its body)."""
    try:
        front = parse_front_matter(skill)
    except UserError:
        return ""
    return "" if front is None or not front.fields else skill[: len(skill) - len(front.body)]


def body_of(skill: str, *, front_matter: bool = True) -> str:
    """The skill without its front matter (with `front_matter`, as the runs
    that protect it read it), without any block and without stray markers."""
    cut = len(front_of(skill)) if front_matter else 0
    return strip_markers(_BLOCK.sub("", skill[cut:]))


def with_guidance(skill: str, guidance: str | None, front: str | None = None, *, front_matter: bool = True) -> str:
    """`front` (by default the skill's own front matter; none without
    `front_matter`), the skill's body, then exactly one block holding
    `guidance` (no block at all when `guidance` is None)."""
    body = body_of(skill, front_matter=front_matter)
    front = "" if not front_matter else front_of(skill) if front is None else front
    if front and body and not front.endswith("\n"):  # a front matter that ended the file, without a newline
        front += "\r\n" if "\r\n" in front else "\n"
    if guidance is None:
        return front + body
    guidance = strip_markers(guidance).strip("\n")
    sep = "" if not body or body.endswith("\n\n") else ("\n" if body.endswith("\n") else "\n\n")
    return f"{front}{body}{sep}{START}\n{guidance}\n{END}\n"


def protect(base: str, candidate: str, *, front_matter: bool = True) -> tuple[str, bool]:
    """`candidate` (a rewrite of `base`) with `base`'s front matter (with
    `front_matter`) and block, or the absence of either, restored. A
    candidate that repeats a front matter, even one that no longer reads as
    YAML, has it replaced by `base`'s.

    Returns the protected text and whether anything had to be restored."""
    front = front_of(base) if front_matter else ""
    text = candidate
    if front and (fenced := _FENCED.match(candidate)) is not None:
        text = candidate[fenced.end():]
    fixed = with_guidance(text, guidance_of(base), front, front_matter=front_matter)
    return fixed, fixed != candidate


def label(before: float, after: float) -> str:
    """How one item moved between the previous epoch's skill and the current one."""
    if before >= 1 and after >= 1:
        return "stable_success"
    if before >= 1:
        return "regressed"
    if after >= 1:
        return "improved"
    return "persistent_fail"


def compare(previous: Iterable[tuple[str, float]], current: Iterable[tuple[str, float]]) -> dict[str, str]:
    """Item id -> label, from (item id, hard score) pairs of both skills."""
    before = dict(previous)
    return {item_id: label(before[item_id], hard) for item_id, hard in current if item_id in before}


def select_pairs(labels: dict[str, str], policy: str) -> list[str]:
    """The item ids the policy keeps, regressions first, then improvements,
    persistent failures and stable successes (ids in order within a label)."""
    wanted = POLICIES[policy]
    rank = {name: i for i, name in enumerate(LABELS)}
    kept = [i for i, lab in labels.items() if lab in wanted]
    return sorted(kept, key=lambda i: (rank[labels[i]], i))
