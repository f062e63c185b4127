"""The lines `show` prints about grading, for a run graded by a judge (env evals)."""

from __future__ import annotations

from typing import Any

from skillstate.cli.tables import Col, table_lines, wrapped


def grading_lines(grading: dict[str, Any] | None, width: int | None = None) -> list[str]:
    """Env evals: each check's pass rate on test per skill, and how far the judge agrees with itself and with
    the deterministic assertions."""
    if not grading or not grading["rows"]:
        return []
    from skillstate.reading.grading import TEST_LABELS

    labels = grading["labels"]

    def rate(found: list[int] | None) -> str:
        return f"{found[0]}/{found[1]}" if found else "-"

    rows = [[row["check"], row["kind"], *(rate(row["rates"].get(label)) for label in labels)]
            for row in sorted(grading["rows"], key=lambda r: (r["kind"] != "expectation", r["check"]))]
    lines = ["", *table_lines([Col("checks on test", shrink=True), Col("graded by"),
                               *(Col(TEST_LABELS.get(label, label), num=True) for label in labels)], rows, width)]
    agree = grading["agreement"]
    parts = [f"judge: {grading['samples']} sample{'s' if grading['samples'] != 1 else ''} a verdict"]
    if agree["samples"] is not None:
        parts.append(f"samples agree on {agree['samples']:.0%} of {agree['statements_sampled']} statements")
    if agree["assertions"] is not None:
        parts.append(f"agrees with the assertions on {agree['assertions']:.0%} of {agree['items_with_both']} items")
    if agree["judge_errors"]:
        parts.append(f"{agree['judge_errors']} items whose judge reply could not be used")
    lines.extend(wrapped("; ".join(parts), width))
    return lines
