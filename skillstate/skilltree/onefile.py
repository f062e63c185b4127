"""The one-file case: a plain markdown skill seen as a tree, and back.

A markdown document (the skill skillstate has always trained) is the tree `{"SKILL.md": text}`.
Such a tree is stored as the text itself (see `blobs.encode_tree`), so a run of a one-file skill
records exactly what it records today.
"""

from __future__ import annotations

from skillstate.errors import UserError
from skillstate.skilltree.tree import SKILL_MD, SkillFile, SkillTree


def from_markdown(text: str) -> SkillTree:
    """The one-file tree of a markdown skill (`UserError` if the text holds a NUL)."""
    return SkillTree({SKILL_MD: SkillFile.of_text(text)})


def is_one_file(tree: SkillTree) -> bool:
    """Whether `tree` is exactly one text file `SKILL.md`, not executable."""
    file = tree.get(SKILL_MD)
    return len(tree) == 1 and file is not None and not file.is_binary and not file.executable


def as_markdown(tree: SkillTree) -> str | None:
    """The markdown of a one-file tree, or None for any other tree."""
    return tree[SKILL_MD].text if is_one_file(tree) else None


def to_markdown(tree: SkillTree) -> str:
    """The markdown of a one-file tree; `UserError` naming what else the tree holds."""
    markdown = as_markdown(tree)
    if markdown is None:
        others = [p for p in tree if p != SKILL_MD][:3]
        raise UserError("this skill is not one markdown file: it holds "
                        + (", ".join(others) if others else "no text SKILL.md"))
    return markdown
