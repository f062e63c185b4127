"""A workspace task's check: run on a finished workspace, in the sandbox, and turned into a score.

The check's files are written into the workspace first (whatever the agent left in their way is
replaced, following no symlink) and bound over it read-only while the check runs, so neither the agent
nor the code under test can change them; a check with a report (`check_report`) writes it to a folder
only its own sandbox holds (`check_report`). A check is a function of the files it runs on, so it runs
once per distinct workspace in a process (many rollouts end in the same one).

`outcome_of` is the one rule from a check's result and the way the agent stopped to a score, shared by
the rollout and by `replay --verify`, which runs the check again on the recorded workspace.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skillstate.envs.episode_loop import clip
from skillstate.envs.workspace.check_report import report_path, verdict
from skillstate.envs.workspace.files import write_files
from skillstate.envs.workspace.sandbox import SandboxSettings, head_and_tail, run_command
from skillstate.envs.workspace.workspace_dir import scratch_dir
from skillstate.envs.workspace.workspace_scan import fingerprint, remove_tree, scan
from skillstate.util import hash_value

SANDBOX_ROOT = "/tmp/workspace"  # where the workspace is inside the sandbox
REPORT_FOLDER = "/tmp/.skillstate-check"
REPORT_MB = 16  # what a check may write to its report's folder
# how an agent may stop that is never a success, whatever the check says: a failed target call, an external
# agent that failed or ran out of time, a command past a limit of the sandbox (the workspace's size, memory)
NEVER_A_SUCCESS = ("rollout_error", "harness_", "sandbox_limit")


_TIMING = re.compile(r" in \d+(?:\.\d+)?s\b(?: \(\d+:\d{2}:\d{2}\))?")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def stable(text: str) -> str:
    """A command's output with what differs between identical runs masked (pytest's durations, addresses), and
    without NUL characters (a model's message holds text)."""
    return _ADDRESS.sub("0x…", _TIMING.sub("", text)).replace("\x00", "")


def with_python(command: str) -> str:
    """`{python}` in a check stands for the Python that runs skillstate (it has pytest); `python` on the agent's
    PATH is that Python too (see `run_command`)."""
    return command.replace("{python}", sys.executable)


def soft_of_output(output: str, default: float) -> float:
    """A last output line `{"score": x}` (x in [0, 1]) is the soft score; else `default`."""
    last = output.strip().splitlines()[-1:] if output.strip() else []
    try:
        data = json.loads(last[0]) if last else None
    except ValueError:
        return default
    score = data.get("score") if isinstance(data, dict) else None
    if isinstance(score, (int, float)) and not isinstance(score, bool) and 0.0 <= score <= 1.0:
        return float(score)
    return default


def outcome_of(check: dict[str, Any], reason: str) -> tuple[float, float, str]:
    """(hard, soft, fail reason) of a rollout whose check gave `check` and whose agent stopped with `reason`: a
    reason in NEVER_A_SUCCESS scores 0; a reason the check contradicts by passing (out of turns, say) is dropped.
    A check recorded before reports were read has no `passed`: its exit code decides."""
    passed = bool(check.get("passed", check.get("exit_code") == 0))
    hard = 1.0 if passed else 0.0
    soft = check.get("soft")
    soft = float(soft) if isinstance(soft, (int, float)) else soft_of_output(str(check.get("output", "")), hard)
    if reason.startswith(NEVER_A_SUCCESS):
        return 0.0, 0.0, reason
    if hard < 1.0:
        last = str(check.get("output", "")).strip().splitlines()[-1:] or [""]
        why = check.get("report") if check.get("exit_code") == 0 and check.get("report") else check.get("result")
        return hard, soft, reason or f"check_failed: {why}: {clip(last[0], 200)}"
    return hard, soft, ""


class Checker:
    """Runs items' checks under `sandbox`, remembering each distinct workspace's result."""

    def __init__(self, sandbox: SandboxSettings):
        self.sandbox = sandbox
        self._results: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def check(self, root: Path, item: dict[str, Any], watch: Callable[[], str | None] | None = None) -> dict[str, Any]:
        """The check's result on the finished workspace at `root` (`watch`: see `run_sandboxed`). Its cache is keyed
        on everything the check can see (`fingerprint`), so no rollout's score is another's."""
        files = item.get("check_files") or {}
        kind = item.get("check_report", "exit")
        try:
            write_files(root, files)
        except (OSError, ValueError) as err:  # the agent left something in the way of the check's files
            return {"command": item["check"], "exit_code": None, "timed_out": False, "passed": False, "soft": 0.0,
                    "result": "the check could not be set up", "output": f"{type(err).__name__}: {err}"}
        seen = fingerprint(root, self.sandbox.workspace_files)
        key = hash_value([item["check"], kind, files, seen]) if seen is not None else None
        with self._lock:
            found = self._results.get(key) if key is not None else None
        if found is not None:
            return dict(found)
        out = self._run(root, item, files, kind, watch)
        if key is not None and not out["timed_out"]:  # a check that ran out of time may pass on a quieter machine
            with self._lock:
                self._results[key] = out
        return dict(out)

    def _run(self, root: Path, item: dict[str, Any], files: dict[str, str], kind: str,
             watch: Callable[[], str | None] | None) -> dict[str, Any]:
        sandboxed = self.sandbox.kind == "bwrap"
        frozen = Path(tempfile.mkdtemp(prefix=f"skillstate-check-{os.getpid()}-"))
        try:
            with scratch_dir("skillstate-check-", REPORT_MB, self.sandbox.run_as) as report:
                write_files(frozen, files)  # bound over the workspace's copies, read-only
                readonly = {str(frozen / rel): f"{SANDBOX_ROOT}/{rel}" for rel in files} if sandboxed else None
                command = with_python(item["check"]).replace("{report}", report_path(report, sandboxed))
                result = run_command(command, root, self.sandbox, SANDBOX_ROOT,
                                     binds={str(report): REPORT_FOLDER} if sandboxed else None, readonly=readonly,
                                     watch=_both(watch, report) if watch is not None else None)
                said = verdict(kind, report, files)
        finally:
            remove_tree(frozen)
        out: dict[str, Any] = {"command": item["check"], "exit_code": result.exit_code,
                               "timed_out": result.timed_out, "result": result.summary(),
                               "output": stable(head_and_tail(result.output, 4_000))}
        if said is None:
            out.update(passed=result.ok, soft=None)
        else:
            out.update(passed=result.ok and said.passed, soft=said.soft, report=said.summary)
        return out


def _both(watch: Callable[[], str | None], report: Path) -> Callable[[], str | None]:
    """The workspace's watch, and the report's folder's size (where it is not a file system of its own)."""
    def look() -> str | None:
        if scan(report, 1024).disk_bytes > REPORT_MB * 1024 * 1024:
            return f"the check's report passed {REPORT_MB} MB"
        return watch()
    return look
