"""The paths a run itself names: its database file, its data, its config file and its skill sources.

An agent's sandbox must never show them (a val or test item's answer is in the data and in the log, and
other runs' logs sit beside this one's), wherever else the sandbox's view reaches. The engine names them
when it builds a run's environment, the command line names the config file it read; the sandbox covers
every one of them (`envs.workspace.sandbox_view`). A process remembers them for as long as it lives:
more hidden is never less safe.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

_LOCK = threading.Lock()
_PATHS: set[str] = set()
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def name_run_paths(paths: Iterable[str | os.PathLike[str] | None]) -> None:
    """Remember `paths` (files or folders; None and empty ones skipped) as paths no sandbox shows."""
    found = set()
    for raw in paths:
        if raw is None or not str(raw).strip():
            continue
        path = os.path.realpath(os.path.expanduser(str(raw)))
        if path != "/":
            found.add(path)
    with _LOCK:
        _PATHS.update(found)


def name_database(url: str) -> None:
    """A SQLite database's file (and the files SQLite keeps beside it), from the store's URL."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return
    path = url[len(prefix):].split("?", 1)[0]
    if path and path != ":memory:":
        name_run_paths([path, *(path + side for side in SQLITE_SIDE_FILES)])


def run_paths() -> frozenset[str]:
    with _LOCK:
        return frozenset(_PATHS)
