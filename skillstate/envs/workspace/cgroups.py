"""Control groups that bound one sandboxed command: how many tasks it may start and how much memory it may use.

A driver running as root can make a group of its own for each command, under the group it runs in (so a
container's own limits still hold above it). The memory limit counts what the command keeps in RAM, the
pages of its in-memory folders (the private /tmp) included, which an address-space limit does not see;
the pids limit counts its processes and threads. Both cgroup v1 (a `pids` and a `memory` hierarchy) and
cgroup v2 (one unified hierarchy with those controllers enabled) are served; where neither can be
written (an ordinary user, a read-only /sys/fs/cgroup), `make_group` returns None and the sandbox falls
back on resource limits (sandbox.py says which).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GRACE = 15.0  # seconds a group's tasks get to leave before it is given up


def _own_path(controller: str) -> str | None:
    """Where this process is in `controller`'s v1 hierarchy ("" for v2 when `controller` is empty)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _n, names, path = line.split(":", 2)
        if (controller and controller in names.split(",")) or (not controller and names == ""):
            return path
    return None


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@dataclass
class Group:
    """One command's groups: a directory per hierarchy (one for v2), each holding the command's tasks."""

    dirs: list[Path]
    memory: Path | None
    v2: bool
    memory_limit: int = 0
    _gone: bool = field(default=False, repr=False)

    def join(self, pid: int) -> None:
        """Put `pid` in every group (from the child, before it runs the command)."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def oom_killed(self) -> bool:
        """Whether the kernel killed a task of the group for passing its memory limit."""
        if self.memory is None:
            return False
        name = "memory.events" if self.v2 else "memory.oom_control"
        try:
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value) > 0
        except OSError:
            return False
        return False

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return sorted(out)

    def kill(self) -> None:
        """Kill every task still in the group."""
        if self.v2 and (self.dirs[0] / "cgroup.kill").exists():
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
                return
            except OSError:
                pass
        for _ in range(3):  # a task may fork while it is being killed: sweep again
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def drop(self) -> None:
        """Kill what is left, wait for it to go, and remove the groups."""
        if self._gone:
            return
        self._gone = True
        self.kill()
        deadline = time.monotonic() + GRACE
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # tasks still leaving
                    if time.monotonic() > deadline:
                        break
                    self.kill()
                    time.sleep(0.05)


def _name() -> str:
    return f"skillstate-{os.getpid()}-{time.monotonic_ns()}"


def _v1(max_tasks: int, memory_bytes: int) -> Group | None:
    pids_root, mem_root = CGROUP_ROOT / "pids", CGROUP_ROOT / "memory"
    made: list[Path] = []
    memory: Path | None = None
    try:
        for controller, root in (("pids", pids_root), ("memory", mem_root)):
            own = _own_path(controller)
            if own is None or not (root / "cgroup.procs").exists():
                continue
            parent = root / own.lstrip("/")
            if not _writable(parent):
                continue
            group = parent / _name()
            group.mkdir()
            made.append(group)
            if controller == "pids":
                (group / "pids.max").write_text(str(max_tasks))
            else:
                (group / "memory.limit_in_bytes").write_text(str(memory_bytes))
                swap = group / "memory.memsw.limit_in_bytes"
                if swap.exists():  # swap may not stretch the limit
                    swap.write_text(str(memory_bytes))
                memory = group
    except OSError:
        for group in made:
            try:
                group.rmdir()
            except OSError:
                pass
        return None
    if not made:
        return None
    return Group(made, memory, v2=False, memory_limit=memory_bytes if memory is not None else 0)


def _v2(max_tasks: int, memory_bytes: int) -> Group | None:
    root = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() else None
    own = _own_path("")
    if root is None or own is None:
        return None
    parent = root / own.lstrip("/")
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    if not {"pids", "memory"} <= set(enabled) or not _writable(parent):
        return None
    group = parent / _name()
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(max_tasks))
        (group / "memory.max").write_text(str(memory_bytes))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
    except OSError:
        try:
            group.rmdir()
        except OSError:
            pass
        return None
    return Group([group], group, v2=True, memory_limit=memory_bytes)


def make_group(max_tasks: int, memory_bytes: int) -> Group | None:
    """New groups bounding a command to `max_tasks` tasks and `memory_bytes` of memory, for a root driver; None
    where none can be made here."""
    if os.geteuid() != 0:
        return None
    return _v2(max_tasks, memory_bytes) or _v1(max_tasks, memory_bytes)


_NAMED = re.compile(r"^(?:skillstate-|cmd-)(\d+)-\d+$")


def _parents() -> list[Path]:
    """Where this process makes groups (and where a driver of an earlier version made them)."""
    out = [CGROUP_ROOT / "pids" / "skillstate"]
    for controller in ("pids", "memory"):
        own = _own_path(controller)
        if own is not None:
            out.append(CGROUP_ROOT / controller / own.lstrip("/"))
    own = _own_path("")
    if own is not None and (CGROUP_ROOT / "cgroup.controllers").exists():
        out.append(CGROUP_ROOT / own.lstrip("/"))
    return out


def sweep_groups(alive: Callable[[int], bool]) -> None:
    """Kill and remove the groups of drivers that are gone (`alive(pid)` says which are not)."""
    if os.geteuid() != 0:
        return
    for parent in _parents():
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            found = _NAMED.match(name)
            if found and not alive(int(found.group(1))):
                v2 = (parent / name / "cgroup.kill").exists() or (parent / "cgroup.controllers").exists()
                Group([parent / name], None, v2=v2).drop()
