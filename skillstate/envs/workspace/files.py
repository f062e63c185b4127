"""The files of a task's workspace as the driver handles them, outside the sandbox: paths the agent names
kept inside the workspace, writes that follow no symlink, reads of regular files only, a snapshot of the
workspace's text and the diff between two snapshots."""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path
from typing import Any

from skillstate.envs.episode_loop import clip
from skillstate.errors import UserError
from skillstate.skilltree.paths import check_path

MAX_FILE_CHARS = 200_000  # the most a file the agent reads or writes may hold
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache"}


class Outside(Exception):
    pass


def inside(root: Path, raw: Any) -> Path:
    """The path `raw` names inside the workspace; `Outside` for anything else (a path that leaves it, or a
    symlink that points out of it)."""
    if not isinstance(raw, str) or not raw.strip():
        raise Outside("give a path relative to the project's root")
    try:
        rel = check_path(raw.strip().removeprefix("./"))
    except UserError as err:
        raise Outside(str(err)) from None
    path = root / rel
    resolved = path.resolve()
    if resolved != root.resolve() and root.resolve() not in resolved.parents:
        raise Outside(f"{raw!r} is outside the project")
    return path


def write_files(root: Path, files: dict[str, str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        write_file(root, check_path(rel), text)


def write_file(root: Path, rel: str, text: str, replace: bool = True) -> None:
    """Write `rel` under `root` without following a symlink anywhere on the way. With `replace` (the check's
    files) whatever the agent left in the way (a symlink, a file where a directory goes) is replaced; without
    (the agent's own writes) it is an error."""
    here = root
    parts = rel.split("/")
    for part in parts[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            if not replace:
                raise NotADirectoryError(f"{here.relative_to(root).as_posix()} is not a directory")
            here.unlink()
        if not here.exists():
            here.mkdir()
    target = here / parts[-1]
    if target.is_symlink() or (target.exists() and not target.is_file()):
        if not replace:
            raise IsADirectoryError(f"{rel} is not a regular file")
        if target.is_dir() and not target.is_symlink():
            from skillstate.envs.workspace.workspace_scan import remove_tree

            remove_tree(target)  # whatever the agent left there, however deep
        else:
            target.unlink()
    elif target.exists():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    os.fchmod(fd, 0o644)  # whatever the driver's umask: a workspace's files are the same in every rollout
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def read_text(path: Path, limit: int = MAX_FILE_CHARS) -> str | None:
    """The start of a regular file's text (a FIFO, a device or a symlink is not read); None when it is none."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1).decode("utf-8", errors="replace")


def file_name(raw: str) -> str:
    """A file name as text, whatever bytes it was made of."""
    return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


SNAPSHOT_BUDGET = 32 * 1024 * 1024  # characters of text a snapshot reads in all (each file: MAX_FILE_CHARS)
MAX_LISTED = 2_000  # paths `list_files` shows


def snapshot(root: Path, max_entries: int = 100_000) -> dict[str, str]:
    """path -> text of the workspace's regular files, with each symlink (to a file or a directory) as its
    target, never followed; caches skipped. Within bounds (`workspace_scan`): at most `max_entries` entries, and
    SNAPSHOT_BUDGET characters read in all (a file past it is named, not read)."""
    from skillstate.envs.workspace.workspace_scan import scan

    out: dict[str, str] = {}
    budget = SNAPSHOT_BUDGET
    top = os.fsencode(root)
    for entry in scan(root, max_entries, skip=SKIPPED_DIRS).entries:
        mode = entry.st.st_mode
        parts = entry.rel.split(b"/")
        if any(os.fsdecode(p) in SKIPPED_DIRS for p in parts[:-1]) or (
                stat.S_ISDIR(mode) and os.fsdecode(parts[-1]) in SKIPPED_DIRS):
            continue
        rel = file_name(os.fsdecode(entry.rel))
        path = os.path.join(top, entry.rel)
        if stat.S_ISLNK(mode):
            try:
                out[rel] = f"(a symlink to {file_name(os.fsdecode(os.readlink(path)))})"
            except OSError:
                continue
        elif stat.S_ISREG(mode):
            if budget <= 0:
                out[rel] = "(not read: the workspace's text passed what a snapshot reads)"
                continue
            text = read_text(Path(os.fsdecode(path)), min(MAX_FILE_CHARS, budget))
            if text is not None:
                out[rel] = text
                budget -= len(text)
    return dict(sorted(out.items()))


def listing(root: Path) -> str:
    """The workspace's files, one a line, for the agent's `list_files` (at most MAX_LISTED)."""
    names = sorted(snapshot(root))
    shown = "\n".join(names[:MAX_LISTED])
    if len(names) > MAX_LISTED:
        shown += f"\n... and {len(names) - MAX_LISTED:,} more files"
    return shown or "(no files)"


def diff_of(before: dict[str, str], after: dict[str, str], limit: int) -> str:
    lines: list[str] = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        lines.extend(difflib.unified_diff((a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
                                          fromfile=f"a/{path}" if a is not None else "/dev/null",
                                          tofile=f"b/{path}" if b is not None else "/dev/null"))
    return clip("".join(lines), limit)
