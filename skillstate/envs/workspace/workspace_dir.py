"""A rollout's workspace folder, bounded in size (`sandbox.workspace_mb`).

Where the driver runs as root, the workspace is a file system of its own: a tmpfs of `workspace_mb`
mounted on the rollout's folder (the pages it holds count against the writing command's memory cgroup),
so a write past the bound fails in the command (no space left) and the host's disk never sees it; the
rollout then ends (`passed`). Anywhere else (an ordinary user cannot mount) the folder is a plain one
on the disk, and its size is watched while commands run: twice a second, and after each; the command
that passes the bound is killed and the rollout ends. A watch can be overshot by what a command writes
between two looks (at most 64 MB a file), a mount cannot.

A driver killed outright leaves its mounts behind; the next driver to make a workspace unmounts those of
drivers that are gone (their process id is in the folder's name).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PREFIX = "skillstate-ws-"
MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4
SLACK = 64 * 1024  # a full tmpfs keeps a few pages back: this close to the bound counts as passing it
_swept = threading.Event()


@dataclass
class Workspace:
    """`folder` holds the rollout's files (`root`, the workspace, and whatever else the rollout keeps beside
    it); `limit_mb` bounds `root`, mounted (a tmpfs) or watched."""

    folder: Path
    root: Path
    limit_mb: int
    mounted: bool

    def used(self) -> int:
        """Bytes the workspace holds now."""
        if self.mounted:
            st = os.statvfs(self.root)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        return tree_bytes(self.root)

    def passed(self) -> int | None:
        """The bound in MB when the workspace reached it, else None."""
        return self.limit_mb if self.used() >= self.limit_mb * 1024 * 1024 - SLACK else None


def tree_bytes(root: Path) -> int:
    """What the files under `root` take on disk (no symlink followed)."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None


def _mount(path: Path, size_mb: int, uid: int) -> bool:
    libc = _libc()
    if libc is None:
        return False
    options = f"size={size_mb}m,mode=0700,uid={uid},gid={uid}".encode()
    return libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) == 0


def _unmount(path: Path) -> None:
    libc = _libc()
    if libc is not None:
        libc.umount2(str(path).encode(), MNT_DETACH)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans() -> None:
    """Unmount and remove the workspaces of drivers that died without doing it (once per process)."""
    if _swept.is_set():
        return
    _swept.set()
    pattern = re.compile(re.escape(PREFIX) + r"(\d+)-[^/]+/workspace$")
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        found = pattern.search(point)
        if found and int(found.group(1)) != os.getpid() and not _alive(int(found.group(1))):
            _unmount(Path(point))
            shutil.rmtree(Path(point).parent, ignore_errors=True)


@contextmanager
def workspace_dir(kind: str, limit_mb: int, run_as: int) -> Iterator[Workspace]:
    """A new rollout folder with its empty workspace, bounded to `limit_mb` (mounted for a root driver of a
    bubblewrap sandbox, else watched); removed, unmounted first, when the block ends."""
    mountable = kind == "bwrap" and os.geteuid() == 0
    if mountable:
        sweep_orphans()
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    root = folder / "workspace"
    root.mkdir()
    mounted = mountable and _mount(root, limit_mb, run_as)
    try:
        yield Workspace(folder, root, limit_mb, mounted)
    finally:
        if mounted:
            _unmount(root)
        shutil.rmtree(folder, ignore_errors=True)
