"""A skill tree checked against the Agent Skills specification (agentskills.io).

Errors (the skill is not a valid Agent Skill): no SKILL.md, or one without a front matter, or a
front matter that is not a YAML mapping; `name` not 1-64 lowercase ASCII letters, digits and
single hyphens inside, or not equal to the directory's name; `description` not 1-1,024
characters; `compatibility` over 500 characters or not text; `metadata` not a mapping.
Warnings (valid, but worth a look): a body over 500 lines; a relative link or a bare
references/, scripts/ or assets/ path in SKILL.md that names no file of the skill, or climbs
out of it; front-matter keys the specification does not name; `metadata` values that are not
strings; `allowed-tools` that is not one string; a lowercase `skill.md`.

Each problem is one `Finding` (the file it is about, and one line); nothing is printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from skillstate.errors import UserError
from skillstate.skilltree.frontmatter import FrontMatter, parse_front_matter
from skillstate.skilltree.links import leaves_root, linked_paths, missing_links
from skillstate.skilltree.tree import SKILL_MD, SkillTree

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
MAX_BODY_LINES = 500
SPEC_FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Finding:
    """One problem: the file it is about (None for the skill as a whole) and a one-line message."""

    file: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}" if self.file else self.message


@dataclass(frozen=True)
class SkillReport:
    """What `validate_skill` found, and the facts a summary line needs."""

    errors: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    name: str | None
    description: str | None
    fields: dict[str, Any]
    files: int
    total_bytes: int
    body_lines: int | None
    agent_skill: bool  # SKILL.md has a front matter (False: a plain markdown skill)

    @property
    def ok(self) -> bool:
        return not self.errors

    def first_error(self) -> str:
        """The first error as one line, saying how many more there are."""
        more = len(self.errors) - 1
        return str(self.errors[0]) + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")

    def raise_if_invalid(self) -> None:
        """`UserError` with `first_error()` when the skill is not valid."""
        if self.errors:
            raise UserError(self.first_error())


def name_problem(name: object) -> str | None:
    """Why `name` is not a valid skill name, or None."""
    if not isinstance(name, str):
        return f"name must be text, not {type(name).__name__} {name!r}"
    if not name:
        return "name is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"name is {len(name)} characters long; at most {MAX_NAME_CHARS} are allowed"
    if _NAME.fullmatch(name):
        return None
    shown = repr(name)
    bad = re.search(r"[^a-z0-9-]", name)
    if bad:
        what = "uppercase letters" if re.search(r"[A-Z]", name) else f"the character {bad.group()!r}"
        return f"name {shown} has {what}: use lowercase letters, digits and hyphens only"
    if name.startswith("-") or name.endswith("-"):
        return f"name {shown} starts or ends with a hyphen"
    return f"name {shown} has a double hyphen"


def validate_skill(tree: SkillTree, dir_name: str | None = None, *, allow_plain: bool = False) -> SkillReport:
    """Check `tree` (read from a directory named `dir_name`, if any). With `allow_plain`, a tree
    that is one SKILL.md without a front matter (a plain markdown skill, as skillstate trains)
    is valid with a warning instead of an error."""
    errors: list[Finding] = []
    warnings: list[Finding] = []
    facts: dict[str, Any] = {"name": None, "description": None, "fields": {}, "body_lines": None,
                             "agent_skill": False}
    md_path = tree.skill_md_path
    if md_path is None:
        errors.append(Finding(None, "SKILL.md is missing (an Agent Skill holds SKILL.md at the top of its directory)"))
    elif tree[md_path].is_binary:
        errors.append(Finding(md_path, "is not UTF-8 text"))
    else:
        if md_path != SKILL_MD:
            warnings.append(Finding(md_path, "name it SKILL.md (not every agent finds a lowercase skill.md)"))
        _check_skill_md(tree, md_path, dir_name, allow_plain, errors, warnings, facts)
    return SkillReport(tuple(errors), tuple(warnings), files=len(tree), total_bytes=tree.total_size, **facts)


def _check_skill_md(tree: SkillTree, md_path: str, dir_name: str | None, allow_plain: bool,
                    errors: list[Finding], warnings: list[Finding], facts: dict[str, Any]) -> None:
    text = tree[md_path].text
    try:
        front = parse_front_matter(text)
    except UserError as err:
        errors.append(Finding(md_path, str(err)))
        return
    if front is None:
        facts["body_lines"] = _lines(text)
        if allow_plain and len(tree) == 1:
            warnings.append(Finding(None, "a plain markdown skill (no front matter): it trains as one file, but an "
                                          "agent needs a front matter with name and description to install it"))
        else:
            errors.append(Finding(md_path, "has no front matter: it must start with a '---' line, then YAML with "
                                           "name and description, then another '---' line"))
        return
    facts.update(agent_skill=True, fields=dict(front.fields), body_lines=_lines(front.body))
    _check_fields(front, md_path, dir_name, errors, warnings, facts)
    _check_body(tree, front, md_path, warnings)


def _check_fields(front: FrontMatter, md_path: str, dir_name: str | None,
                  errors: list[Finding], warnings: list[Finding], facts: dict[str, Any]) -> None:
    fields = front.fields
    if "name" not in fields:
        errors.append(Finding(md_path, "the front matter has no name (1-64 lowercase letters, digits and hyphens)"))
    else:
        name = fields["name"]
        problem = name_problem(name)
        if problem:
            errors.append(Finding(md_path, problem))
        else:
            facts["name"] = name
            if dir_name is not None and dir_name != name:
                errors.append(Finding(md_path, f"name {name!r} differs from its directory's name {dir_name!r}: "
                                               "they must be equal"))
    if "description" not in fields:
        errors.append(Finding(md_path, "the front matter has no description (what the skill does and when to use it)"))
    else:
        description = fields["description"]
        if not isinstance(description, str):
            errors.append(Finding(md_path, f"description must be text, not {type(description).__name__}"))
        elif not description.strip():
            errors.append(Finding(md_path, "description is empty"))
        elif len(description) > MAX_DESCRIPTION_CHARS:
            errors.append(Finding(md_path, f"description is {len(description):,} characters long; at most "
                                           f"{MAX_DESCRIPTION_CHARS:,} are allowed"))
        else:
            facts["description"] = description
    if "compatibility" in fields:
        value = fields["compatibility"]
        if not isinstance(value, str) or not value.strip():
            errors.append(Finding(md_path, "compatibility must be non-empty text"))
        elif len(value) > MAX_COMPATIBILITY_CHARS:
            errors.append(Finding(md_path, f"compatibility is {len(value):,} characters long; at most "
                                           f"{MAX_COMPATIBILITY_CHARS} are allowed"))
    if "metadata" in fields:
        value = fields["metadata"]
        if not isinstance(value, dict):
            errors.append(Finding(md_path, f"metadata must be a mapping of keys to values, not {type(value).__name__}"))
        else:
            odd = [k for k, v in value.items() if not isinstance(v, str)]
            if odd:
                warnings.append(Finding(md_path, f"metadata {odd[0]!r} is not a string (the specification maps "
                                                 "strings to strings; quote it)"))
    if "allowed-tools" in fields and not isinstance(fields["allowed-tools"], str):
        warnings.append(Finding(md_path, "allowed-tools is not one string (the specification lists tools "
                                         "separated by spaces)"))
    unknown = [k for k in fields if k not in SPEC_FIELDS]
    if unknown:
        warnings.append(Finding(md_path, f"front-matter key{'s' if len(unknown) > 1 else ''} "
                                         f"{', '.join(map(repr, unknown))} not in the specification (kept as "
                                         "is; agents may ignore them)"))


def _check_body(tree: SkillTree, front: FrontMatter, md_path: str, warnings: list[Finding]) -> None:
    lines = _lines(front.body)
    if lines > MAX_BODY_LINES:
        warnings.append(Finding(md_path, f"the body has {lines:,} lines; keep it under {MAX_BODY_LINES} and move "
                                         "detail into references/"))
    missing = set(missing_links(front.body, tree))
    for path in linked_paths(front.body):
        if leaves_root(path):
            warnings.append(Finding(md_path, f"links to {path}, outside the skill directory"))
        elif path in missing:
            warnings.append(Finding(md_path, f"links to {path}, which the skill does not hold"))


def _lines(text: str) -> int:
    """Lines as an editor counts them: "\n" ends a line (U+2028 and the like do not)."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)
