"""The files of a task's workspace as the driver handles them, outside the sandbox: paths the agent names
kept inside the workspace, writes that follow no symlink, reads of regular files only, a snapshot of the
workspace's text and the diff between two snapshots."""

from __future__ import annotations

import difflib
import os
import shutil
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
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    elif target.exists():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
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


def snapshot(root: Path) -> dict[str, str]:
    """path -> text of the workspace's regular files, with each symlink (to a file or a directory) as its
    target, never followed; caches skipped."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs):
            if os.path.islink(os.path.join(dirpath, name)):
                files.append(name)  # a symlink to a directory: recorded, not walked
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(set(files)):
            path = Path(dirpath) / name
            rel = file_name(path.relative_to(root).as_posix())
            if path.is_symlink():
                out[rel] = f"(a symlink to {file_name(os.readlink(path))})"
                continue
            text = read_text(path)
            if text is not None:
                out[rel] = text
    return dict(sorted(out.items()))


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
