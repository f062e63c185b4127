"""A rollout's workspace folder, bounded in size (`sandbox.workspace_mb`) and in files (`workspace_files`).

Where the driver runs as root, the workspace is a file system of its own: a tmpfs of `workspace_mb`
and `workspace_files` inodes mounted on the rollout's folder (the pages it holds count against the
writing command's memory cgroup), so a write past the bound fails in the command (no space left) and
the host's disk never sees it; the rollout then ends (`passed`). Anywhere else (an ordinary user cannot
mount) the folder is a plain one on the disk, and its size and its files are watched while commands run:
twice a second, and after each; the command that passes a bound is killed and the rollout ends. A watch
can be overshot by what a command writes between two looks (at most 64 MB a file), a mount cannot.
After the agent, `problem` walks the whole workspace once more (depth, path lengths, sparse files at
their full size: `workspace_scan`) before the driver reads any of it.

A driver killed outright leaves its mounts, folders and cgroups behind; the next driver to make a
workspace removes those of drivers that are gone (their process id is in each name).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from skillstate.envs.workspace.workspace_scan import problem as tree_problem
from skillstate.envs.workspace.workspace_scan import remove_tree, scan

PREFIX = "skillstate-ws-"
LEFTOVERS = ("skillstate-ws-", "skillstate-check-", "skillstate-verify-", "ss-")  # folders named with a pid
MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4
SLACK = 64 * 1024  # a full tmpfs keeps a few pages back: this close to the bound counts as passing it
_swept = threading.Event()


@dataclass
class Workspace:
    """`folder` holds the rollout's files (`root`, the workspace, and whatever else the rollout keeps beside
    it); `limit_mb` and `max_files` bound `root`, mounted (a tmpfs) or watched."""

    folder: Path
    root: Path
    limit_mb: int
    mounted: bool
    max_files: int = 100_000

    def used(self) -> int:
        """Bytes the workspace holds now."""
        if self.mounted:
            st = os.statvfs(self.root)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        return scan(self.root, self.max_files).disk_bytes

    def passed(self) -> str | None:
        """Which bound the workspace reached (cheap enough to ask twice a second), else None."""
        if self.mounted:
            st = os.statvfs(self.root)
            if (st.f_blocks - st.f_bfree) * st.f_frsize >= self.limit_mb * 1024 * 1024 - SLACK:
                return f"the workspace reached its {self.limit_mb:,} MB (sandbox.workspace_mb)"
            if st.f_files - st.f_ffree >= self.max_files:
                return f"the workspace holds {self.max_files:,} files (sandbox.workspace_files)"
            return None
        found = scan(self.root, self.max_files)
        if found.problem:
            return f"{found.problem} (sandbox.workspace_files)"
        if found.disk_bytes >= self.limit_mb * 1024 * 1024 - SLACK:
            return f"the workspace reached its {self.limit_mb:,} MB (sandbox.workspace_mb)"
        return None

    def problem(self) -> str | None:
        """What the workspace holds past a bound, looked at whole (before the driver reads it), else None."""
        return self.passed() or tree_problem(self.root, self.max_files, self.limit_mb * 1024 * 1024)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None


def _mount(path: Path, size_mb: int, uid: int, inodes: int) -> bool:
    libc = _libc()
    if libc is None:
        return False
    options = f"size={size_mb}m,nr_inodes={inodes},mode=0700,uid={uid},gid={uid}".encode()
    return libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) == 0


def _unmount(path: Path) -> None:
    libc = _libc()
    if libc is not None:
        libc.umount2(str(path).encode(), MNT_DETACH)


_owner: list[int] = []  # this process's lock file, held open (and locked) for as long as it lives


def hold_owner_lock() -> None:
    """Lock `skillstate-owner-PID.lock` for this process's life: the lock goes with the process, however it dies,
    and another driver (in another process namespace too) can tell that this one is alive."""
    if _owner:
        return
    import fcntl

    path = Path(tempfile.gettempdir()) / f"skillstate-owner-{os.getpid()}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    _owner.append(fd)


def _alive(pid: int) -> bool:
    """Whether the driver `pid` lives: its lock is held; or, where it took none, the process exists here."""
    import fcntl

    if pid == os.getpid():
        return True
    path = Path(tempfile.gettempdir()) / f"skillstate-owner-{pid}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True  # held: alive
    finally:
        os.close(fd)
    try:
        path.unlink()
    except OSError:
        pass
    return False


def sweep_orphans() -> None:
    """Remove what drivers that died outright left (once per process): their workspaces' mounts, their rollout,
    check and socket folders, and their cgroups."""
    if _swept.is_set():
        return
    _swept.set()
    hold_owner_lock()
    pattern = re.compile(re.escape(PREFIX) + r"(\d+)-[^/]+/workspace$")
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        found = pattern.search(point)
        if found and not _alive(int(found.group(1))):
            _unmount(Path(point))
    named = re.compile("^(?:" + "|".join(re.escape(p) for p in LEFTOVERS) + r")(\d+)-")
    for base in {tempfile.gettempdir(), "/tmp"}:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            found = named.match(name)
            if found and not _alive(int(found.group(1))):
                _unmount(Path(base) / name / "workspace")
                remove_tree(Path(base) / name)
    from skillstate.envs.workspace.cgroups import sweep_groups

    sweep_groups(_alive)


@contextmanager
def workspace_dir(kind: str, limit_mb: int, run_as: int, max_files: int = 100_000) -> Iterator[Workspace]:
    """A new rollout folder with its empty workspace, bounded to `limit_mb` and `max_files` (mounted for a root
    driver of a bubblewrap sandbox, else watched); removed, unmounted first, when the block ends."""
    mountable = kind == "bwrap" and os.geteuid() == 0
    sweep_orphans()
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    root = folder / "workspace"
    root.mkdir()
    mounted = mountable and _mount(root, limit_mb, run_as, max_files)
    try:
        yield Workspace(folder, root, limit_mb, mounted, max_files)
    finally:
        if mounted:
            _unmount(root)
        remove_tree(folder)


@contextmanager
def scratch_dir(prefix: str, limit_mb: int, run_as: int) -> Iterator[Path]:
    """A small folder of the driver's that a sandbox writes into (a check's report): for a root driver a tmpfs of
    `limit_mb`, so that nothing written there reaches the host's disk; removed when the block ends."""
    sweep_orphans()
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    inner = folder / "workspace"  # named as a workspace's, so that a dead driver's is unmounted too
    inner.mkdir()
    mounted = os.geteuid() == 0 and _mount(inner, limit_mb, run_as, 1024)
    try:
        yield inner
    finally:
        if mounted:
            _unmount(inner)
        remove_tree(folder)
