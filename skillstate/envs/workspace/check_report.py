"""A check that proves it ran: the report it writes where the agent could not, read by the driver.

A check's exit code alone can be faked by the code it tests: a module that calls `os._exit(0)` when the
tests import it ends pytest with exit code 0 before a single test ran. A task whose `check_report` is
`junit` or `json` names `{report}` in its check command; the check writes its report there, in a folder
that exists only in the check's own sandbox (the agent's commands never see it) and is empty when the
check starts, and the check passes only when its exit code is 0 *and* its report says so:

- `junit` (pytest's `--junitxml={report}`): at least one test, none failed, errored or skipped, and every
  test the check's own files define (`test_*` functions and `Test*` classes' `test_*` methods of its
  Python files) reported as passed. A missing, empty or unreadable report fails. The soft score is the
  share of those tests that passed.
- `json`: a JSON object `{"passed": true|false, "score": x}` (score optional, in [0, 1]).

What this does not do: the code under test runs in the check's own process, so code written to attack
the checker (rather than to pass the tests) can still forge a report; the diff the analysts read shows it.
"""

from __future__ import annotations

import ast
import json
import os
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

REPORT_DIR = "/tmp/.skillstate-check"  # where the report's folder is inside the check's sandbox
REPORT_NAME = "report"
MAX_REPORT_BYTES = 8 * 1024 * 1024
KINDS = ("exit", "junit", "json")
# CPython 3.11's parser keeps its recursion depth in interpreter-wide state, so two threads parsing at once
# can fail with "SystemError: AST constructor recursion depth mismatch"; rollouts check in parallel threads.
_PARSE = threading.Lock()


@dataclass(frozen=True)
class Verdict:
    """What a report says: whether the check passed, its soft score (None: the exit code decides) and a line."""

    passed: bool
    soft: float | None
    summary: str


def expected_tests(check_files: dict[str, str]) -> set[str]:
    """`module::test` (or `module::Class.test`) for each test the check's Python test files define."""
    out: set[str] = set()
    for path, text in check_files.items():
        name = path.rsplit("/", 1)[-1]
        if not name.endswith(".py") or not (name.startswith("test_") or name.endswith("_test.py")):
            continue
        try:
            with _PARSE:
                tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        stem = name[:-3]
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                out.add(f"{stem}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                out.update(f"{stem}::{node.name}.{fn.name}" for fn in node.body
                           if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name.startswith("test"))
    return out


def _key(case: ElementTree.Element) -> str:
    """A JUnit test case as `module::test` (`module::Class.test` in a class); parameters dropped."""
    parts = (case.get("classname") or "").split(".")
    name = (case.get("name") or "").split("[", 1)[0]
    if not parts[-1]:  # a file that could not be collected: its name is the module's
        return name
    if len(parts) >= 2 and parts[-1][:1].isupper():  # tests.test_x.TestThing
        return f"{parts[-2]}::{parts[-1]}.{name}"
    return f"{parts[-1]}::{name}"


def _read(path: Path) -> bytes | None:
    try:
        if not path.is_file() or path.is_symlink():
            return None
        with open(path, "rb") as f:
            return f.read(MAX_REPORT_BYTES + 1)
    except OSError:
        return None


def junit_verdict(data: bytes | None, expected: set[str]) -> Verdict:
    if not data:
        return Verdict(False, 0.0, "junit: no report: the check did not run to its end")
    if len(data) > MAX_REPORT_BYTES:
        return Verdict(False, 0.0, "junit: the report is larger than 8 MB")
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError:
        return Verdict(False, 0.0, "junit: the report is not XML a check writes")
    passed: set[str] = set()
    failed: list[str] = []
    cases = list(root.iter("testcase"))
    for case in cases:
        if any(case.find(tag) is not None for tag in ("failure", "error", "skipped")):
            failed.append(_key(case))
        else:
            passed.add(_key(case))
    missing = sorted(expected - passed - set(failed))
    ran_ok = len(cases) - len(failed)
    share = (len(expected & passed) / len(expected)) if expected else (ran_ok / len(cases) if cases else 0.0)
    if not cases:
        return Verdict(False, 0.0, "junit: the report holds no test")
    if failed or missing:
        bad = failed[:3] + [f"{m} never ran" for m in missing[:3]]
        return Verdict(False, share, f"junit: {ran_ok} of {len(cases)} tests passed; " + ", ".join(bad))
    return Verdict(True, share, f"junit: {ran_ok} of {len(cases)} tests passed")


def json_verdict(data: bytes | None) -> Verdict:
    if not data:
        return Verdict(False, 0.0, "json: no report: the check did not run to its end")
    try:
        value = json.loads(data[:MAX_REPORT_BYTES])
    except (ValueError, RecursionError):
        return Verdict(False, 0.0, "json: the report is not JSON")
    if not isinstance(value, dict) or not isinstance(value.get("passed"), bool):
        return Verdict(False, 0.0, 'json: the report is not an object with "passed": true or false')
    score = value.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= float(score) <= 1.0:
        score = 1.0 if value["passed"] else 0.0
    return Verdict(value["passed"], float(score), f"json: {'passed' if value['passed'] else 'failed'}")


def verdict(kind: str, folder: Path, check_files: dict[str, str]) -> Verdict | None:
    """What the report in `folder` says (None for a check whose exit code decides)."""
    if kind == "exit":
        return None
    data = _read(folder / REPORT_NAME)
    if kind == "junit":
        return junit_verdict(data, expected_tests(check_files))
    return json_verdict(data)


def report_path(folder: Path, sandboxed: bool) -> str:
    """`{report}` in a check command: inside the sandbox, or the host folder's file without one."""
    return f"{REPORT_DIR}/{REPORT_NAME}" if sandboxed else os.path.join(folder, REPORT_NAME)
