"""A skill bank as Agent Skills directories: one skill per bank skill, so a
distilled bank installs in an agent as it is. Pure.

Each bank skill becomes `NAME/SKILL.md`: `name` is made from its title
(lowercase letters, digits and single hyphens, at most 64 characters, made
unique within the bank), `description` is its `when_to_apply` (when that is
empty, its principle and the tasks it is for: its category's, or any), cut
to the 1,024 characters the specification allows, and the body holds the
title, the principle and the category. The bank's common mistakes, when it
has any, become one more skill, `common-mistakes` (or a free variant of
it), for every task.
"""

from __future__ import annotations

import re
import unicodedata

from skillstate.bank.skills import Bank, BankSkill
from skillstate.skilltree import SKILL_MD, SkillFile, SkillTree, add_front_matter
from skillstate.skilltree.validate import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS

MISTAKES = "common-mistakes"


def slug(text: str, fallback: str) -> str:
    """`text` as a skill name: ASCII letters and digits, lowercased, runs of anything else one
    hyphen, none first or last, at most 64 characters (cut at a hyphen when one is near)."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    name = re.sub(r"[^a-z0-9]+", "-", ascii_text).strip("-")
    if len(name) > MAX_NAME_CHARS:
        cut = name[:MAX_NAME_CHARS]
        name = (cut.rsplit("-", 1)[0] if "-" in cut[MAX_NAME_CHARS // 2:] else cut).strip("-")
    return name or fallback


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 2
    while out in taken:
        suffix = f"-{n}"
        out = name[: MAX_NAME_CHARS - len(suffix)].rstrip("-") + suffix
        n += 1
    taken.add(out)
    return out


def _description(text: str) -> str:
    one_line = " ".join(text.split())
    if len(one_line) <= MAX_DESCRIPTION_CHARS:
        return one_line
    return one_line[: MAX_DESCRIPTION_CHARS - 3].rstrip() + "..."


def _tree(name: str, description: str, body: str) -> SkillTree:
    text = add_front_matter(body, {"name": name, "description": description})
    return SkillTree({SKILL_MD: SkillFile.of_text(text)})


def skill_tree_of(skill: BankSkill, name: str) -> SkillTree:
    """One bank skill as the Agent Skill `name`."""
    scope = f"\nApplies to tasks of the category `{skill.category}`.\n" if skill.category else ""
    body = f"# {skill.title.strip()}\n\n{skill.principle.strip()}\n{scope}"
    when = f"Use for tasks of the category {skill.category}." if skill.category else "Use for any task."
    about = skill.when_to_apply.strip() or f"{skill.principle.strip() or skill.title.strip()} {when}".strip()
    return _tree(name, _description(about), body)


def bank_skill_trees(bank: Bank) -> list[tuple[str, SkillTree]]:
    """(name, tree) of each skill of `bank`, in the bank's order, then its common mistakes."""
    taken: set[str] = set()
    out = [(name, skill_tree_of(skill, name))
           for skill in bank.skills for name in [_unique(slug(skill.title, slug(f"skill {skill.id}", "skill")), taken)]]
    if bank.mistakes:
        name = _unique(MISTAKES, taken)
        lines = [f"- {m.text}" + (f" (in {m.category} tasks)" if m.category else "") for m in bank.mistakes]
        body = "# Common mistakes\n\nAvoid these:\n\n" + "".join(f"{line}\n" for line in lines)
        out.append((name, _tree(name, "Mistakes seen on earlier tasks of every kind, to avoid. Use for any task.",
                                body)))
    return out
