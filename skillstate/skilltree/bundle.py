"""A trained tree in one text: the bundle the engine passes around, and the view people and the optimizer read.

A run that trains a whole skill directory records each skill as a tree blob and its file blobs
(`blobs`). Between storing and reading, the engine holds the tree as one self-contained text, the
*bundle*, so that everything that hands a skill around as a string (a rollout on a Ray actor, a
repair's variants, a cache keyed by text) carries every file with it. A bundle starts with a NUL
character, which no markdown skill holds, so it is never mistaken for one; it never reaches a model.

The *view* is what a model or a person reads: every text file in a `<file path="...">` block,
SKILL.md first, and one line per binary file (which is never shown or edited).
"""

from __future__ import annotations

import json
import re

from skillstate.errors import CorruptLogError, UserError
from skillstate.skilltree.blobs import BINARY_MARKER, decode_tree, file_blob, file_from_blob, is_tree_blob
from skillstate.skilltree.skill_md import skill_md_path
from skillstate.skilltree.tree import SkillTree
from skillstate.util import canonical_json

BUNDLE_MARKER = "\x00skillstate-bundle/1\n"
_FILE = re.compile(r'<file path="([^"\n]+)">\n(.*?)\n?</file>(?:\n|$)', re.DOTALL)


def is_bundle(text: str) -> bool:
    return text.startswith(BUNDLE_MARKER)


def bundle(tree: SkillTree) -> str:
    """`tree` as one self-contained text (each file's blob text and executable flag by path)."""
    return BUNDLE_MARKER + canonical_json({p: [file_blob(f), f.executable] for p, f in tree.items()})


def unbundle(text: str) -> SkillTree:
    """The tree a bundle holds (`CorruptLogError` when it is not one)."""
    if not is_bundle(text):
        raise CorruptLogError("not a skill bundle")
    try:
        files = json.loads(text[len(BUNDLE_MARKER):])
        pairs = [(path, blob, bool(executable)) for path, (blob, executable) in files.items()]
    except (ValueError, TypeError, AttributeError) as err:
        raise CorruptLogError(f"a skill bundle is malformed ({err})") from None
    out = {}
    for path, blob, executable in pairs:
        kind = "binary" if blob.startswith(BINARY_MARKER) else "text"
        out[path] = file_from_blob(path, blob, {"kind": kind, "executable": executable})
    try:
        return SkillTree(out)
    except UserError as err:
        raise CorruptLogError(f"a skill bundle holds what no tree may: {err}") from None


def skill_tree_of(text: str, blobs=None) -> SkillTree | None:
    """The tree a skill text stands for when it is a bundle or (with `blobs`) a tree blob; None for markdown."""
    if is_bundle(text):
        return unbundle(text)
    if is_tree_blob(text) and blobs is not None:
        return decode_tree(text, blobs)
    return None


def skill_md_text(tree: SkillTree) -> str:
    return tree[skill_md_path(tree)].text


def view(tree: SkillTree) -> str:
    """The tree as a model or a person reads it: SKILL.md, then every other file, each in a block."""
    md = skill_md_path(tree)
    out = []
    for path in [md, *(p for p in tree if p != md)]:
        file = tree[path]
        if file.is_binary:
            out.append(f'<file path="{path}" binary="{file.size} bytes"/>')
        else:
            out.append(f'<file path="{path}">\n{file.text.rstrip(chr(10))}\n</file>')
    return "\n".join(out) + "\n"


def view_files(text: str) -> dict[str, str]:
    """path -> text of the text files a view shows (empty for a text that is not a view)."""
    return {m.group(1): m.group(2) for m in _FILE.finditer(text)}
