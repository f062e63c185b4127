"""The `describe` edit: set the `description` of a skill's front matter. Pure.

An agent that installs Agent Skills shows the target only each skill's `name` and
`description` until it decides to load one (progressive disclosure), so the
description decides whether the skill is used at all. Front-matter protection
keeps every other edit, rewrite and full rewrite out of the front matter; this op
is the one way in, and it may change nothing but that field. Its `content` is the
whole new description: one line of 1 to 1,024 characters (the Agent Skills
limit), or the edit is skipped as invalid.
"""

from __future__ import annotations

from skillstate.errors import UserError
from skillstate.skilltree.frontmatter import parse_front_matter, set_field
from skillstate.skilltree.validate import MAX_DESCRIPTION_CHARS

DESCRIBE = "describe"


def description_problem(text: str) -> str | None:
    """Why `text` cannot be a skill's description (None when it can)."""
    if not text.strip():
        return "empty"
    if "\n" in text or "\r" in text:
        return "not one line"
    if len(text.strip()) > MAX_DESCRIPTION_CHARS:
        return f"over {MAX_DESCRIPTION_CHARS} characters"
    return None


def description_of(front: str) -> str | None:
    """The description a front matter (its fences included) holds, or None."""
    try:
        parsed = parse_front_matter(front) if front else None
    except UserError:
        return None
    value = parsed.fields.get("description") if parsed is not None else None
    return value if isinstance(value, str) else None


def describe_status(front: str, content: str) -> str | None:
    """Why a `describe` edit would change nothing or cannot apply to `front`
    (`no_front_matter`, `invalid_description`, `no_change`); None when it applies."""
    if not front:
        return "no_front_matter"
    if description_problem(content) is not None:
        return "invalid_description"
    if description_of(front) == content.strip():
        return "no_change"
    return None


def apply_describe(front: str, content: str) -> tuple[str, str]:
    """(the front matter with its description set to `content`, the edit's
    status): `applied`, or `skipped_no_front_matter`, `skipped_invalid` or
    `unchanged` with the front matter as it was."""
    problem = describe_status(front, content)
    if problem == "no_change":
        return front, "unchanged"
    if problem is not None:
        return front, "skipped_no_front_matter" if problem == "no_front_matter" else "skipped_invalid"
    try:
        return set_field(front, "description", content.strip()), "applied"
    except UserError:  # a description written in a form set_field does not rewrite
        return front, "skipped_invalid"
