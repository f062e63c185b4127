"""What an external agent left in its workspace, recorded exactly, so that `replay --verify` can run the
check again on the same workspace.

The record is a blob of its own (the trajectory names it by hash): a marker, then canonical JSON of
- `files`: each regular file the agent added or changed, its bytes in a blob (text, or base64 after
  BINARY_MARKER), its size and whether it is executable;
- `links`: each symlink, with its target (never followed);
- `dirs`: each empty folder;
- `removed`: the starting files that are no longer regular files.
A name that is not UTF-8 is kept as its bytes in base64 (`{"b64": ...}`), so any name a POSIX file
system holds (`NUL`, `a?b`, `x:y.txt`, any depth) round-trips. File blobs are content-addressed, so
rollouts that leave the same file store it once. Caches (`__pycache__`, `.git`, ...) are skipped, as
in the diff. The whole record, names and link targets included, is bounded (`max_record_mb`); a
workspace that does not fit is recorded as not checkable, never cut silently.
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


def walk(root: Path) -> tuple[dict[bytes, tuple[bytes, bool]], dict[bytes, bytes], list[bytes]]:
    """(files: path -> (bytes, executable), links: path -> target, empty dirs) under `root`, paths as bytes
    relative to it; nothing followed, caches skipped, special files (FIFOs, sockets) left out."""
    files: dict[bytes, tuple[bytes, bool]] = {}
    links: dict[bytes, bytes] = {}
    empty: list[bytes] = []
    top = os.fsencode(root)
    stack = [b""]
    while stack:
        rel = stack.pop()
        here = os.path.join(top, rel) if rel else top
        try:
            names = sorted(os.listdir(here))
        except OSError:
            continue
        if not names and rel:
            empty.append(rel)
        for name in names:
            path, sub = os.path.join(here, name), (rel + b"/" + name if rel else name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                links[sub] = os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                if os.fsdecode(name) not in SKIPPED_DIRS:
                    stack.append(sub)
            elif stat.S_ISREG(st.st_mode):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        files[sub] = (f.read(), bool(st.st_mode & 0o111))
                except OSError:
                    continue
    return files, links, empty


def record_workspace(root: Path, start: dict[str, str], limit_bytes: int) -> Record:
    """The record of the workspace at `root` against its starting files `start` (path -> text)."""
    files, links, empty = walk(root)
    entries: list[dict[str, Any]] = []
    blobs: dict[str, str] = {}
    size = 0
    changed: list[str] = []
    for path in sorted(files):
        data, executable = files[path]
        before = start.get(shown(path))
        if before is not None and not executable and before.encode("utf-8") == data:
            continue
        blob = content_blob(data)
        key = sha256_text(blob)
        blobs[key] = blob
        entry: dict[str, Any] = {"path": _name(path), "blob": key, "size": len(data)}
        if executable:
            entry["executable"] = True
        entries.append(entry)
        changed.append(shown(path))
        size += len(data) + len(path)
    link_entries = [{"path": _name(p), "target": _name(t)} for p, t in sorted(links.items())]
    size += sum(len(p) + len(t) for p, t in links.items()) + sum(len(d) for d in empty)
    changed += [shown(p) for p in sorted(links)]
    present = {shown(p) for p in files}
    removed = sorted(p for p in start if p not in present)
    size += sum(len(p) for p in removed)
    manifest = MARKER + canonical_json({"files": entries, "links": link_entries,
                                        "dirs": [_name(d) for d in sorted(empty)], "removed": removed})
    if size > limit_bytes:
        empty_manifest = MARKER + canonical_json({"files": [], "links": [], "dirs": [], "removed": []})
        return Record(empty_manifest, {sha256_text(empty_manifest): empty_manifest}, changed[:200], removed[:200],
                      size, complete=False)
    blobs[sha256_text(manifest)] = manifest
    return Record(manifest, blobs, changed, removed, size)


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
    writes: dict[bytes, tuple[bytes, bool]] = {p.encode("utf-8"): (t.encode("utf-8"), False)
                                               for p, t in start.items() if p not in removed}
    for entry in data.get("files") or []:
        writes[_safe(_raw(entry.get("path")))] = (content_of(blob(str(entry.get("blob")))),
                                                  bool(entry.get("executable")))
    for path, (content, executable) in sorted(writes.items()):
        full = os.path.join(top, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(content)
        os.chmod(full, 0o755 if executable else 0o644)
    for entry in data.get("links") or []:
        full = os.path.join(top, _safe(_raw(entry.get("path"))))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(_raw(entry.get("target")), full)
    for name in data.get("dirs") or []:
        os.makedirs(os.path.join(top, _safe(_raw(name))), exist_ok=True)
