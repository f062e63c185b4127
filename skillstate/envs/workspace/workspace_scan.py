"""Walking a workspace the agent shaped, from the driver, within bounds.

Every walk of a workspace goes through `scan`: iterative (a tree thousands of folders deep is no
recursion), following no symlink, and bounded in entries, depth and path length, so that no tree an
agent leaves can exhaust the driver's stack, memory or time. What a workspace may hold is `problem`'s:
past `max_entries` entries, `MAX_DEPTH` levels, `MAX_PATH_BYTES` of path, or files whose sizes (sparse
ones at their full size) add up past its byte bound, the driver reads no more of it and the rollout
ends (`sandbox_limit`).

`fingerprint` is a workspace's identity for the check's cache: every entry's path, type, permission
bits, size, bytes (hashed in a stream) and link target, caches included. `clear_caches` removes the
compiled caches an agent may have planted (`__pycache__`, `*.pyc`) before the check and the diff, so
that what the check runs is what the diff shows. `remove_tree` removes a tree of any depth.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 128  # folder levels: no honest project nests deeper
MAX_PATH_BYTES = 3000  # a path relative to the workspace, under the system's 4096 with room for the workspace's own
CACHE_DIRS = {"__pycache__"}
CACHE_SUFFIXES = (".pyc", ".pyo")
HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    rel: bytes  # the path relative to the workspace, as the file system holds it
    st: os.stat_result

    @property
    def depth(self) -> int:
        return self.rel.count(b"/") + 1


@dataclass
class Scan:
    entries: list[Entry]
    problem: str | None = None

    @property
    def apparent_bytes(self) -> int:
        """The files' sizes as they claim them (a sparse file at its full size)."""
        return sum(e.st.st_size for e in self.entries if stat.S_ISREG(e.st.st_mode))

    @property
    def disk_bytes(self) -> int:
        return sum(e.st.st_blocks * 512 for e in self.entries)


def scan(root: Path, max_entries: int = 1_000_000, skip: frozenset[str] | set[str] = frozenset()) -> Scan:
    """Every entry under `root`, sorted by path, none followed; folders named in `skip` not entered. Stops at the
    first bound passed, saying which in `problem`."""
    top = os.fsencode(root)
    out: list[Entry] = []
    stack: list[bytes] = [b""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(top, rel) if rel else top) as found:
                names = sorted(e.name for e in found)
        except OSError:
            continue
        folders = []
        for name in names:
            sub = rel + b"/" + name if rel else name
            if len(sub) > MAX_PATH_BYTES:
                return Scan(out, f"a path in the workspace is longer than {MAX_PATH_BYTES:,} bytes")
            try:
                st = os.lstat(os.path.join(top, sub))
            except OSError:
                continue
            entry = Entry(sub, st)
            if entry.depth > MAX_DEPTH:
                return Scan(out, f"the workspace nests folders more than {MAX_DEPTH} deep")
            out.append(entry)
            if len(out) > max_entries:
                return Scan(out, f"the workspace holds more than {max_entries:,} files and folders")
            if stat.S_ISDIR(st.st_mode) and os.fsdecode(name) not in skip:
                folders.append(sub)
        stack.extend(reversed(folders))
    out.sort(key=lambda e: e.rel)
    return Scan(out)


def problem(root: Path, max_entries: int, max_bytes: int) -> str | None:
    """What the workspace at `root` holds past its bounds (None when it holds nothing past them)."""
    found = scan(root, max_entries)
    if found.problem:
        return found.problem
    if found.apparent_bytes > max_bytes:
        return f"the workspace's files add up to more than {max_bytes // (1024 * 1024):,} MB"
    return None


def _digest(path: bytes, size: int) -> str:
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        return f"unreadable:{err.errno}"
    with os.fdopen(fd, "rb") as f:
        read = 0
        while read <= size:
            chunk = f.read(HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            read += len(chunk)
    return h.hexdigest()


def fingerprint(root: Path, max_entries: int) -> str | None:
    """A hash of everything a check can see in the workspace; None for one past its bounds (never cached)."""
    found = scan(root, max_entries)
    if found.problem:
        return None
    top = os.fsencode(root)
    h = hashlib.sha256()
    for e in found.entries:
        mode = e.st.st_mode
        h.update(e.rel + b"\0" + f"{stat.S_IFMT(mode)}:{mode & 0o7777}:{e.st.st_size}".encode() + b"\0")
        full = os.path.join(top, e.rel)
        if stat.S_ISREG(mode):
            h.update(_digest(full, e.st.st_size).encode())
        elif stat.S_ISLNK(mode):
            try:
                h.update(os.readlink(full))
            except OSError:
                pass
        h.update(b"\n")
    return h.hexdigest()


def clear_caches(root: Path, max_entries: int) -> None:
    """Remove the compiled caches in the workspace: every `__pycache__` folder and `*.pyc` / `*.pyo` file."""
    top = os.fsencode(root)
    for e in scan(root, max_entries, skip=CACHE_DIRS).entries:
        name = e.rel.rsplit(b"/", 1)[-1]
        full = os.path.join(top, e.rel)
        if stat.S_ISDIR(e.st.st_mode) and os.fsdecode(name) in CACHE_DIRS:
            remove_tree(full)
        elif not stat.S_ISDIR(e.st.st_mode) and name.endswith(tuple(s.encode() for s in CACHE_SUFFIXES)):
            try:
                os.unlink(full)
            except OSError:
                pass


def remove_tree(path: str | bytes | Path) -> None:
    """Remove `path` and everything under it, however deep, following no symlink."""
    if not os.path.lexists(path):
        return
    subprocess.run(["rm", "-rf", "--one-file-system", "--", os.fsdecode(path)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
