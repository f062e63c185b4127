"""The files SKILL.md points to: markdown links and bare paths under references/, scripts/ and
assets/, as the skill root-relative paths they name."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection
from urllib.parse import unquote

_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
_BARE = re.compile(r"(?<![\w/.\-])(?:\./)?((?:references|scripts|assets)/[\w\-./]*[\w\-])")
_FENCED = re.compile(r"(?ms)^[ \t]*(```|~~~).*?^[ \t]*\1")


def linked_paths(markdown: str) -> list[str]:
    """The relative targets `markdown` names, in order of first mention, each normalized against
    the skill root (`./a/../b` -> `b`; a target that climbs out keeps its leading `..`). URLs,
    anchors and absolute paths are left out; bare paths count inside code too (`python
    scripts/x.py`), markdown links only outside fenced code."""
    found: list[tuple[int, str]] = []
    unfenced = _FENCED.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), markdown)  # same offsets, no code
    for match in _LINK.finditer(unfenced):
        target = match.group(1)
        if re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*:", target) or target.startswith(("#", "/", "~")):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if path:
            found.append((match.start(), path))
    found.extend((m.start(), m.group(1)) for m in _BARE.finditer(markdown))
    out: list[str] = []
    for _, path in sorted(found):
        normal = posixpath.normpath(path)
        if normal not in out and normal != ".":
            out.append(normal)
    return out


def leaves_root(path: str) -> bool:
    """Whether a normalized linked path climbs out of the skill directory."""
    return path == ".." or path.startswith("../")


def missing_links(markdown: str, held: Collection[str]) -> list[str]:
    """The paths `markdown` links to inside the skill that are neither a file in `held` (the skill's
    paths) nor a folder of one, in order of first mention."""
    folders = {path.rsplit("/", i)[0] for path in held for i in range(1, path.count("/") + 1)}
    return [p for p in linked_paths(markdown) if not leaves_root(p) and p not in held and p not in folders]
