"""Which file of a tree is its SKILL.md, and the tree with that file replaced: what a run that
trains a skill directory's SKILL.md records, reads back and exports."""

from __future__ import annotations

from skillstate.skilltree.tree import SKILL_MD, SkillTree


def skill_md_path(tree: SkillTree) -> str:
    """The path of the tree's SKILL.md (`skill.md` in a tree that has only that spelling, which the
    check warns about)."""
    return SKILL_MD if SKILL_MD in tree or "skill.md" not in tree else "skill.md"


def with_skill_md(tree: SkillTree, text: str) -> SkillTree:
    """`tree` with its SKILL.md's text replaced by `text` (the trained one)."""
    return tree.with_text(skill_md_path(tree), text)
