"""A stored skill as readers show it: a markdown skill as it is, and a trained skill directory (a tree
blob, `train_files`) as its view, every file in a block (`skilltree.bundle.view`), or as SKILL.md
alone where a reader needs the text an agent loads first (its name, its front matter)."""

from __future__ import annotations

from skillstate.skilltree import SkillTree, decode_tree, is_tree_blob, skill_md_path
from skillstate.skilltree.bundle import view
from skillstate.storage.store import Store


def stored_tree(store: Store, skill: str) -> SkillTree | None:
    """The tree a stored skill (by hash) is, when the run trains a directory; None for a markdown skill."""
    text = store.get_blob(skill)
    return decode_tree(text, store.get_blobs) if is_tree_blob(text) else None


def skill_text(store: Store, skill: str) -> str:
    """What `show`, `diff`, `why` and the dashboard read of a stored skill: the markdown, or a tree's view."""
    text = store.get_blob(skill)
    return view(decode_tree(text, store.get_blobs)) if is_tree_blob(text) else text


def skill_md_of(store: Store, skill: str) -> str:
    """SKILL.md's text of a stored skill (the markdown itself for a markdown skill)."""
    text = store.get_blob(skill)
    if not is_tree_blob(text):
        return text
    tree = decode_tree(text, store.get_blobs)
    return tree[skill_md_path(tree)].text


def text_files(tree: SkillTree) -> dict[str, str]:
    """path -> text of a tree's text files, SKILL.md first (what `diff`, `why` and the dashboard read)."""
    md = skill_md_path(tree)
    return {p: tree[p].text for p in [md, *(p for p in tree if p != md)] if not tree[p].is_binary}


def stored_files(store: Store, skill: str) -> dict[str, str] | None:
    """`text_files` of a stored skill that is a trained tree; None for a markdown skill."""
    tree = stored_tree(store, skill)
    return text_files(tree) if tree is not None else None
