"""bench/suite_budget.py, which .ci/run runs on the JUnit report of the README's pytest: it lists the slowest
tests and fails when one test, or the suite's tests together, pass their budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "suite_budget.py"


def report(tmp_path: Path, times: list[float]) -> Path:
    cases = "".join(f'<testcase classname="tests.test_x" name="test_{i}" time="{t}"/>' for i, t in enumerate(times))
    path = tmp_path / "tests.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>', encoding="utf-8")
    return path


def budget(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_a_suite_within_its_budget_passes_and_lists_its_slowest_tests(tmp_path):
    res = budget(str(report(tmp_path, [1.5, 30.0, 0.2])), "--show", "2")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["3 tests, 32 s together (budget 3600 s); the slowest:",
                                       "    30.0 s  tests.test_x::test_1", "     1.5 s  tests.test_x::test_0"]


def test_one_test_over_its_budget_fails_naming_it(tmp_path):
    res = budget(str(report(tmp_path, [1.0, 125.0])))
    assert res.returncode == 1
    assert "over the budget of 120 s a test: tests.test_x::test_1 took 125.0 s" in res.stderr


def test_the_suite_over_its_total_fails(tmp_path):
    res = budget(str(report(tmp_path, [20.0] * 4)), "--total", "60")
    assert res.returncode == 1 and "its tests took 80 s" in res.stderr


def test_a_missing_report_is_one_line_exit_2(tmp_path):
    res = budget(str(tmp_path / "none.xml"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
