"""The default suite's time budget, read from a JUnit report of one run of it.

    PYTEST_ADDOPTS="--junitxml=tests.xml" pytest      # the README's command, with a report
    python bench/suite_budget.py tests.xml              # the slowest tests and the totals against the budget

It prints the slowest tests (setup, call and teardown together, as the report counts them) and the summed time,
and exits 1 when a test takes longer than `--per-test` seconds or the tests together take longer than `--total`
seconds (summed over the workers, so the figure does not depend on how many ran at once). `.ci/run` runs it on
the report of the README's `pytest`, so a change that makes the suite slow fails CI where it happens. The
budgets are two to three times what the suite takes on a quiet 2-core machine (the slowest test about 40 s,
the tests together about 1,600 s with 3 workers), so load alone does not trip them.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET

PER_TEST_S = 120.0
TOTAL_S = 3600.0


def durations(report: str) -> list[tuple[float, str]]:
    """(seconds, test id) of every test case in a JUnit report, the slowest first."""
    root = ET.parse(report).getroot()
    out = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        out.append((float(case.get("time") or 0.0), name))
    return sorted(out, reverse=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", help="a JUnit XML report of the default suite (pytest --junitxml)")
    parser.add_argument("--per-test", type=float, default=PER_TEST_S, help="seconds one test may take")
    parser.add_argument("--total", type=float, default=TOTAL_S, help="seconds the tests may take together")
    parser.add_argument("--show", type=int, default=15, help="how many of the slowest tests to list")
    args = parser.parse_args()
    try:
        times = durations(args.report)
    except (OSError, ET.ParseError) as err:
        print(f"test budget: cannot read {args.report}: {err}", file=sys.stderr)
        return 2
    total = sum(t for t, _ in times)
    print(f"{len(times)} tests, {total:.0f} s together (budget {args.total:.0f} s); the slowest:")
    for seconds, name in times[:args.show]:
        print(f"  {seconds:6.1f} s  {name}")
    over = [(t, n) for t, n in times if t > args.per_test]
    failed = False
    for seconds, name in over:
        print(f"over the budget of {args.per_test:.0f} s a test: {name} took {seconds:.1f} s", file=sys.stderr)
        failed = True
    if total > args.total:
        print(f"over the budget of {args.total:.0f} s for the suite: its tests took {total:.0f} s", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
