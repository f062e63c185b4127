"""Reading the files a user names (config, skill, data, prompts,
trajectories): only regular files. A FIFO, a device or a socket would block
the read forever (or never end), so it is refused before anything is read;
the refusal is an `OSError` like any other unreadable file, so every caller
reports it the way it reports a missing file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class NotRegularFile(OSError):
    """The path names something other than a regular file."""


def read_input_bytes(path: str | Path) -> bytes:
    """The bytes of a regular file; `NotRegularFile` (an OSError) for anything else."""
    path = Path(path).expanduser()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # opening a FIFO must not wait for a writer
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotRegularFile(errno.EINVAL, f"it is {kind}, not a regular file", str(path))
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read()
    finally:
        if fd >= 0:
            os.close(fd)


def read_input_text(path: str | Path, encoding: str = "utf-8") -> str:
    """The text of a regular file (`UnicodeDecodeError` if it is not `encoding`)."""
    return read_input_bytes(path).decode(encoding)


def split_file(base: Path, split: str) -> Path:
    """The file of split `split` in data directory `base`: SPLIT.jsonl or SPLIT.json. A `DataError` when both
    exist or neither does."""
    from skillstate.errors import DataError

    found = [base / f"{split}{suffix}" for suffix in (".jsonl", ".json") if (base / f"{split}{suffix}").exists()]
    if len(found) > 1:
        raise DataError(f"{base}: both {split}.jsonl and {split}.json exist; keep one of them")
    if not found:
        raise DataError(f"{base}: missing {split}.jsonl")
    return found[0]
