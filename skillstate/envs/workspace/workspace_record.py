"""What an external agent left in its workspace, recorded exactly, so that `replay --verify` can run the
check again on the same workspace.

The record is a blob of its own (the trajectory names it by hash): a marker, then canonical JSON of
- `files`: each regular file the agent added or changed, its bytes in a blob (text, or base64 after
  BINARY_MARKER), its size and its permission bits;
- `links`: each symlink, with its target (never followed);
- `dirs`: each empty folder;
- `removed`: the starting files that are no longer regular files.
A name that is not UTF-8 is kept as its bytes in base64 (`{"b64": ...}`), so any name a POSIX file
system holds (`NUL`, `a?b`, `x:y.txt`, any depth) round-trips. File blobs are content-addressed, so
rollouts that leave the same file store it once. Caches (`__pycache__`, `.git`, ...) are skipped, as
in the diff. The whole record, names and link targets included, is bounded (`max_record_mb`): files are
looked at (their sizes, sparse ones at their full size) before any is read, and a workspace that does
not fit is recorded as not checkable, never cut silently.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillstate.envs.workspace.files import SKIPPED_DIRS
from skillstate.envs.workspace.workspace_scan import scan
from skillstate.util import canonical_json, sha256_text

MARKER = "\x00skillstate-workspace/1\n"
BINARY_MARKER = "\x00skillstate-binary/1\n"


class BadRecord(Exception):
    """A record that cannot be rebuilt (a path that leaves the workspace, a malformed entry)."""


@dataclass
class Record:
    """A recorded workspace: its blob's text (`manifest`), every blob by hash (the manifest's included), the
    paths it changed and removed (as shown text), its size in bytes and whether it fit its bound."""

    manifest: str
    blobs: dict[str, str] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    size: int = 0
    complete: bool = True
    why: str = ""  # why it is not complete

    @property
    def hash(self) -> str:
        return sha256_text(self.manifest)


def _name(raw: bytes) -> Any:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode("ascii")}


def _raw(name: Any) -> bytes:
    if isinstance(name, str):
        return name.encode("utf-8")
    if isinstance(name, dict) and isinstance(name.get("b64"), str):
        try:
            return base64.b64decode(name["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise BadRecord("a name's base64 is not valid") from None
    raise BadRecord(f"a name of the wrong shape: {str(name)[:80]}")


def shown(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def content_blob(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not text.startswith("\x00"):
        return text
    return BINARY_MARKER + base64.b64encode(data).decode("ascii")


def content_of(blob: str) -> bytes:
    if blob.startswith(BINARY_MARKER):
        try:
            return base64.b64decode(blob[len(BINARY_MARKER):], validate=True)
        except (binascii.Error, ValueError):
            raise BadRecord("a binary file's blob is not valid base64") from None
    return blob.encode("utf-8")


def record_workspace(root: Path, start: dict[str, str], limit_bytes: int, max_entries: int = 100_000) -> Record:
    """The record of the workspace at `root` against its starting files `start` (path -> text)."""
    found = scan(root, max_entries, skip=SKIPPED_DIRS)
    entries = [e for e in found.entries if not any(os.fsdecode(p) in SKIPPED_DIRS for p in e.rel.split(b"/")[:-1])
               and not (stat.S_ISDIR(e.st.st_mode) and os.fsdecode(e.rel.rsplit(b"/", 1)[-1]) in SKIPPED_DIRS)]
    top = os.fsencode(root)
    files = [e for e in entries if stat.S_ISREG(e.st.st_mode)]
    links = [e for e in entries if stat.S_ISLNK(e.st.st_mode)]
    folders = {e.rel for e in entries if stat.S_ISDIR(e.st.st_mode)}
    holding = {e.rel.rsplit(b"/", 1)[0] for e in entries if b"/" in e.rel}
    empty = sorted(folders - holding)
    size = (sum(e.st.st_size + len(e.rel) for e in files) + sum(len(e.rel) + e.st.st_size for e in links)
            + sum(len(d) for d in empty))
    present = {shown(e.rel) for e in files}
    removed = sorted(p for p in start if p not in present)
    size += sum(len(p) for p in removed)
    if found.problem or size > limit_bytes:  # looked at, not read: nothing past the bound is held in memory
        why = found.problem or (f"the agent left {size:,} bytes of changed files, names and links, more than the "
                                f"record keeps (env_config.max_record_mb)")
        return _unrecorded(files, removed, size, why)
    blobs: dict[str, str] = {}
    file_entries: list[dict[str, Any]] = []
    changed: list[str] = []
    for e in files:
        data = _read(os.path.join(top, e.rel))
        if data is None:  # a file the driver cannot read: the record would not be the workspace
            return _unrecorded(files, removed, size, f"the driver cannot read {shown(e.rel)!r}")
        mode = e.st.st_mode & 0o7777
        before = start.get(shown(e.rel))
        if before is not None and mode == 0o644 and before.encode("utf-8") == data:
            continue
        blob = content_blob(data)
        key = sha256_text(blob)
        blobs[key] = blob
        file_entries.append({"path": _name(e.rel), "blob": key, "size": len(data), "mode": mode})
        changed.append(shown(e.rel))
    link_entries = []
    for e in links:
        try:
            link_entries.append({"path": _name(e.rel), "target": _name(os.readlink(os.path.join(top, e.rel)))})
            changed.append(shown(e.rel))
        except OSError:
            continue
    manifest = MARKER + canonical_json({"files": file_entries, "links": link_entries,
                                        "dirs": [_name(d) for d in empty], "removed": removed})
    blobs[sha256_text(manifest)] = manifest
    return Record(manifest, blobs, changed, removed, size)


def unrecorded(why: str) -> Record:
    """The record of a workspace that was not read (past a bound of the sandbox): not checkable."""
    return _unrecorded([], [], 0, why)


def _unrecorded(files: list[Any], removed: list[str], size: int, why: str) -> Record:
    """The record of a workspace that cannot be recorded whole: not checkable, its names only (the first 200)."""
    empty_manifest = MARKER + canonical_json({"files": [], "links": [], "dirs": [], "removed": []})
    return Record(empty_manifest, {sha256_text(empty_manifest): empty_manifest}, [shown(e.rel) for e in files[:200]],
                  removed[:200], size, complete=False, why=why)


def _read(path: bytes) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _safe(raw: bytes) -> bytes:
    parts = raw.split(b"/")
    if not raw or raw.startswith(b"/") or any(p in (b"", b".", b"..") for p in parts) or b"\x00" in raw:
        raise BadRecord(f"the path {shown(raw)!r} leaves the workspace")
    return raw


def rebuild(root: Path, start: dict[str, str], manifest: str, blob: Any) -> None:
    """Write the recorded workspace under `root` (new, empty): the starting files less the removed ones, then
    the recorded files, links and empty folders. `blob(hash)` reads a blob."""
    if not manifest.startswith(MARKER):
        raise BadRecord("the trajectory's workspace record is not one")
    try:
        data = json.loads(manifest[len(MARKER):])
    except ValueError:
        raise BadRecord("the workspace record is not JSON") from None
    top = os.fsencode(root)
    removed = set(data.get("removed") or [])
    writes: dict[bytes, tuple[bytes, int]] = {p.encode("utf-8"): (t.encode("utf-8"), 0o644)
                                              for p, t in start.items() if p not in removed}
    for entry in data.get("files") or []:
        mode = entry.get("mode")
        writes[_safe(_raw(entry.get("path")))] = (content_of(blob(str(entry.get("blob")))),
                                                  mode & 0o7777 if isinstance(mode, int) else 0o644)
    for path, (content, mode) in sorted(writes.items()):
        full = os.path.join(top, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(content)
        os.chmod(full, mode)
    for entry in data.get("links") or []:
        full = os.path.join(top, _safe(_raw(entry.get("path"))))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(_raw(entry.get("target")), full)
    for name in data.get("dirs") or []:
        os.makedirs(os.path.join(top, _safe(_raw(name))), exist_ok=True)
