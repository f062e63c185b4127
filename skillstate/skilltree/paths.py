"""The paths a skill tree may hold: relative POSIX paths that stay inside the skill directory.

`check_path` is the one gate every path passes (a tree's keys, an archive's entries, a file
found on disk). It returns the path in its stored form (Unicode NFC, so that a tree read on
macOS hashes like the same tree read on Linux) or raises `UserError` with one line that names
the path and says what is wrong with it.
"""

from __future__ import annotations

import re
import unicodedata

from skillstate.errors import UserError

MAX_PATH_CHARS = 1024
MAX_SEGMENT_BYTES = 255
MAX_DEPTH = 32

# Names a tree never holds: version-control and cache clutter that readers skip on disk and in archives.
IGNORED_NAMES = frozenset({".git", ".hg", ".svn", "__pycache__", ".DS_Store", "Thumbs.db", "__MACOSX"})

# Characters Windows refuses in a file name (':' also makes drive letters and NTFS streams).
_FORBIDDEN_CHARS = set('\\:*?"<>|')
_WINDOWS_DEVICES = re.compile(r"(?i)^(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³])(\..*)?$")


def _problem(path: str) -> str | None:
    """What makes `path` unsafe or unportable, or None."""
    if not isinstance(path, str):
        return "it is not a string"
    if path == "":
        return "it is empty"
    if "\x00" in path:
        return "it holds a NUL character"
    if len(path) > MAX_PATH_CHARS:
        return f"it is longer than {MAX_PATH_CHARS:,} characters"
    if path.startswith("/"):
        return "it is absolute (a skill's paths are relative to its directory)"
    if re.match(r"^[A-Za-z]:", path):
        return "it starts with a drive letter"
    if "\\" in path:
        return "it holds a backslash (use '/' between names)"
    segments = path.split("/")
    if len(segments) > MAX_DEPTH:
        return f"it is nested deeper than {MAX_DEPTH} levels"
    for segment in segments:
        found = _segment_problem(segment)
        if found:
            return found
    return None


def _segment_problem(segment: str) -> str | None:
    if segment == "":
        return "it has an empty segment (a leading, trailing or doubled '/')"
    if segment in (".", ".."):
        return f"it has a '{segment}' segment (paths may not leave or name the skill directory)"
    folded = unicodedata.normalize("NFKC", segment)
    if folded in (".", "..") or "/" in folded or "\\" in folded:
        return f"its segment {segment!r} normalizes to {folded!r}, which could leave the skill directory"
    if any(ord(c) < 32 or ord(c) == 127 for c in segment):
        return "it holds a control character"
    bad = sorted(set(segment) & _FORBIDDEN_CHARS)
    if bad:
        return f"it holds {bad[0]!r}, which Windows refuses in a file name"
    if segment != segment.rstrip(" ."):
        return f"its segment {segment!r} ends with a space or a dot, which Windows drops"
    if _WINDOWS_DEVICES.match(segment):
        return f"its segment {segment!r} is a device name on Windows"
    if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
        return f"a segment is longer than {MAX_SEGMENT_BYTES} bytes"
    if segment in IGNORED_NAMES:
        return f"{segment!r} is not part of a skill (readers skip it)"
    return None


def path_problem(path: str) -> str | None:
    """What makes `path` unsafe or unportable as a path in a skill, in a few words, or None."""
    problem = _problem(path)
    if problem is None:
        normal = unicodedata.normalize("NFC", path)
        problem = _problem(normal) if normal != path else None
    return problem


def check_path(path: str) -> str:
    """`path` in its stored form (NFC), or `UserError` naming it and what is wrong."""
    problem = path_problem(path)
    if problem is not None:
        raise UserError(f"unsafe path {shown_path(path)} in a skill: {problem}")
    return unicodedata.normalize("NFC", path)


def is_safe_path(path: str) -> bool:
    """Whether `check_path` accepts `path`."""
    return path_problem(path) is None


def is_ignored(path: str) -> bool:
    """Whether a path read from disk or an archive is clutter to skip (a `.git/` file, `__pycache__/`, ...)."""
    return any(segment in IGNORED_NAMES for segment in path.split("/"))


def shown_path(path: object) -> str:
    """`repr(path)`, cut in the middle when long."""
    text = repr(path)
    return text if len(text) <= 80 else text[:60] + "…" + text[-12:]
