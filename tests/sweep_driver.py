"""Subprocess driver for tests/test_sweep.py.

    python3 tests/sweep_driver.py CLI-ARGS...     the `skillstate` command line
    python3 tests/sweep_driver.py --open URL      only construct Store(URL) (schema race)

Controlled by environment variables, so the command line stays the CLI's own:

SWEEP_START_AT       wall-clock time (time.time()) to wait for after the imports,
                     so several drivers start at the same instant
SWEEP_PAUSE_EVENTS   pause right after the append that brings the run's log to
                     at least this many events
SWEEP_PAUSE_CALLS    pause right after this process recorded this many LLM calls
                     (mid-stage: calls are recorded, the stage's events are not)
SWEEP_MARKER         file written (with "events N" or "calls N") when pausing
SWEEP_RELEASE        file whose appearance ends the pause; without it the pause
                     lasts until the process is killed (or SWEEP_PAUSE_MAX s)

A paused driver is meant to be killed with SIGKILL (a crash at a known point)
or released (a live driver holding the run's lease).
"""

from __future__ import annotations

import os
import sys
import threading
import time

from skillstate.cli.main import main
from skillstate.storage.store import Store

_paused = threading.Event()


def _pause(what: str) -> None:
    if _paused.is_set():
        return
    _paused.set()
    marker = os.environ.get("SWEEP_MARKER")
    if marker:
        tmp = marker + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(what)
        os.replace(tmp, marker)
    release = os.environ.get("SWEEP_RELEASE")
    deadline = time.time() + float(os.environ.get("SWEEP_PAUSE_MAX", "120"))
    while time.time() < deadline:
        if release and os.path.exists(release):
            return
        time.sleep(0.01)
    os._exit(99)  # nobody came: never outlive a broken test


def _install_hooks() -> None:
    pause_events = os.environ.get("SWEEP_PAUSE_EVENTS")
    pause_calls = os.environ.get("SWEEP_PAUSE_CALLS")
    if pause_events:
        limit = int(pause_events)
        real_append = Store.append

        def append(self, run_id, new_events, **kw):
            stored = real_append(self, run_id, new_events, **kw)
            if stored and stored[-1].seq >= limit:
                _pause(f"events {stored[-1].seq}")
            return stored

        Store.append = append
    if pause_calls:
        limit = int(pause_calls)
        real_record = Store.record_call
        count = {"n": 0}
        lock = threading.Lock()

        def record_call(self, **kw):
            real_record(self, **kw)
            with lock:
                count["n"] += 1
                n = count["n"]
            if n >= limit:
                _pause(f"calls {n}")

        Store.record_call = record_call


def _wait_for_start() -> None:
    start = os.environ.get("SWEEP_START_AT")
    if start:
        delay = float(start) - time.time()
        if delay > 0:
            time.sleep(delay)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--open"]:
        _wait_for_start()
        Store(args[1]).close()
        print("opened")
        sys.exit(0)
    _install_hooks()
    _wait_for_start()
    sys.argv = ["skillstate", *args]
    main()
