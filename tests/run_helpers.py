"""Helpers the run tests share: the CLI in-process, a run's log, and a driver subprocess that
pauses at a point (tests/sweep_driver.py) to be killed with SIGKILL there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from skillstate.cli.main import cli
from skillstate.storage.store import Store

DRIVER = Path(__file__).parent / "sweep_driver.py"

# `skillstate run` without the mechanisms against blocking lines that are on by default (the blocker search, the
# prune, the minibatch screen) and the prune's test of the lowest type: the loop the tests of other mechanisms
# were written for (tests/conftest.py's SMALL leaves them off too).
OLD_LOOP = ["--set", "blocker_search=off", "--set", "prune=off", "--set", "prune_blockers=false", "--set",
            "edit_screen=off"]


def call(*args: str, code: int = 0) -> str:
    """`skillstate ARGS` in-process; its output, after checking the exit code."""
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == code, res.output
    return res.output


def log_of(db: str, run_id: str) -> list[dict]:
    """The run's events as `skillstate log --json` prints them."""
    return json.loads(call("log", run_id, "--json", "--db", db))


def start_driver(tmp_path: Path, name: str, args: list[str], **env: str) -> subprocess.Popen:
    """`skillstate ARGS` in a driver subprocess that writes a marker when it reaches its pause point."""
    full = {**os.environ, **env, "SWEEP_MARKER": str(tmp_path / f"{name}.marker")}
    return subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=str(tmp_path), env=full,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.err", "w"),  # noqa: SIM115
                            stdin=subprocess.DEVNULL)


def kill_at_pause(tmp_path: Path, name: str, proc: subprocess.Popen, timeout: float = 120.0) -> str:
    """Wait for the driver's marker, then SIGKILL it; what the marker says."""
    marker = tmp_path / f"{name}.marker"
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            assert proc.poll() is None, (tmp_path / f"{name}.err").read_text()[-2000:]
            assert time.monotonic() < deadline, f"{name} never paused"
            time.sleep(0.01)
        return marker.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def stored_events(db: str, run_id: str) -> list[tuple[str, str]]:
    """(type, payload) of each stored event of the run, in order."""
    store = Store(db)
    try:
        return [(s.type, s.payload) for s in store.read_events(run_id)]
    finally:
        store.close()
