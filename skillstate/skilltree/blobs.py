"""A tree as content-addressed text blobs, in a canonical, platform-independent encoding.

A file's blob is its text (text files: the blob's hash is the file's sha256) or, for a binary
file, `BINARY_MARKER` followed by the bytes in base64. The tree's blob is `TREE_MARKER` followed
by canonical JSON (sorted keys, no spaces, UTF-8) of `{"files": {path: entry}}`, an entry being
`{"blob", "kind", "sha256", "size"}` (plus `"executable": true` for an executable file): the blob
key that holds the contents, the kind, the sha256 and size of the exact bytes. The tree blob
names its file blobs by hash, so a walker that follows the hashes a blob holds reaches them.

Both markers start with a NUL character, which a text file never holds (see `tree.kind_of`): no
markdown skill can be mistaken for a tree, so the one-file case can stay a plain text blob.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from skillstate.errors import CorruptLogError, UserError
from skillstate.skilltree.onefile import as_markdown, from_markdown
from skillstate.skilltree.tree import SkillFile, SkillTree
from skillstate.util import canonical_json, sha256_text

TREE_FORMAT = "skillstate-tree/1"
TREE_MARKER = "\x00" + TREE_FORMAT + "\n"
BINARY_MARKER = "\x00skillstate-binary/1\n"


def is_tree_blob(text: str) -> bool:
    """Whether a stored skill text is a tree blob (else it is a one-file markdown skill)."""
    return text.startswith("\x00skillstate-tree/")


def file_blob(file: SkillFile) -> str:
    """The text blob that stores `file`'s contents."""
    if file.is_binary:
        return BINARY_MARKER + base64.b64encode(file.data).decode("ascii")
    return file.text


def file_entry(file: SkillFile) -> dict[str, Any]:
    """A file's entry in the tree blob."""
    entry: dict[str, Any] = {"blob": sha256_text(file_blob(file)), "kind": file.kind,
                             "sha256": file.sha256, "size": file.size}
    if file.executable:
        entry["executable"] = True
    return entry


def tree_manifest(tree: SkillTree) -> dict[str, Any]:
    """The JSON value the tree blob encodes: `{"files": {path: entry}}`."""
    return {"files": {path: file_entry(file) for path, file in tree.items()}}


def tree_blob(tree: SkillTree) -> str:
    """The tree blob's text: the marker, then the canonical JSON of `tree_manifest`."""
    return TREE_MARKER + canonical_json(tree_manifest(tree))


@dataclass(frozen=True)
class EncodedTree:
    """What storing a tree takes: `root`, the text the run records as its skill (a tree blob, or
    the markdown itself in the one-file case), and `blobs`, every blob by hash (root included)."""

    root: str
    blobs: Mapping[str, str]

    @property
    def root_hash(self) -> str:
        return sha256_text(self.root)


def encode_tree(tree: SkillTree, *, as_tree: bool = False) -> EncodedTree:
    """The blobs that store `tree`. A tree that is one text file `SKILL.md` (not executable) is stored
    as that text alone, byte for byte what a one-file skill is today, unless `as_tree` (a run that
    trains a directory keeps it one, even when its edits leave SKILL.md alone); any other tree as a
    tree blob and one blob per distinct file."""
    markdown = as_markdown(tree)
    if markdown is not None and not as_tree:
        return EncodedTree(markdown, {sha256_text(markdown): markdown})
    blobs = {sha256_text(text): text for text in (file_blob(f) for f in tree.values())}
    root = tree_blob(tree)
    blobs[sha256_text(root)] = root
    return EncodedTree(root, blobs)


def tree_hash(tree: SkillTree) -> str:
    """The hash a run would record for `tree` (the one-file case: the sha256 of its markdown)."""
    return encode_tree(tree).root_hash


BlobSource = Mapping[str, str] | Callable[[list[str]], Mapping[str, str]]


def decode_tree(root: str, blobs: BlobSource) -> SkillTree:
    """The tree a stored skill text stands for. `blobs` maps hash -> text, or is a function that
    returns the blobs of a list of hashes (as `Store.get_blobs` does); a one-file text needs none.
    `CorruptLogError` when the tree blob is malformed or a file blob is missing or altered."""
    if not is_tree_blob(root):
        return from_markdown(root)
    entries = manifest_entries(root)
    wanted = sorted({e["blob"] for e in entries.values()})
    found = blobs(wanted) if callable(blobs) else {h: blobs[h] for h in wanted if h in blobs}
    files = {}
    for path, entry in entries.items():
        text = found.get(entry["blob"])
        if text is None:
            raise CorruptLogError(f"the skill tree names blob {entry['blob'][:12]} for {path!r}, which is missing")
        file = file_from_blob(path, text, entry)
        if file.sha256 != entry["sha256"] or file.size != entry["size"] or file.kind != entry["kind"]:
            raise CorruptLogError(f"the skill tree's file {path!r} does not match its blob {entry['blob'][:12]}")
        files[path] = file
    try:
        return SkillTree(files)
    except UserError as err:  # a stored tree was checked when it was made: this one was altered since
        raise CorruptLogError(f"a skill tree blob holds what no tree may: {err}") from None


def manifest_entries(root: str) -> dict[str, dict[str, Any]]:
    if not root.startswith(TREE_MARKER):
        raise CorruptLogError(f"unknown skill tree format {root[1:].split(chr(10), 1)[0][:40]!r} "
                              f"(this skillstate reads {TREE_FORMAT})")
    try:
        manifest = json.loads(root[len(TREE_MARKER):])
        entries = manifest["files"]
        if not isinstance(entries, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("blob"), str) and isinstance(e.get("sha256"), str)
                and isinstance(e.get("size"), int) and e.get("kind") in ("text", "binary") for e in entries.values()):
            raise ValueError("malformed entries")
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptLogError(f"a skill tree blob is malformed ({err})") from None
    return entries


def file_from_blob(path: str, text: str, entry: Mapping[str, Any]) -> SkillFile:
    executable = entry.get("executable") is True
    if entry["kind"] == "text":
        return SkillFile(text.encode("utf-8"), executable)
    if not text.startswith(BINARY_MARKER):
        raise CorruptLogError(f"the blob of the binary file {path!r} lacks its marker")
    try:
        data = base64.b64decode(text[len(BINARY_MARKER):].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise CorruptLogError(f"the blob of the binary file {path!r} is not base64") from None
    return SkillFile(data, executable)
