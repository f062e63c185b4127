"""Pure planning of SkillRL's evolve phase: which categories to evolve and
which of their failures to show the teacher.

Failures are taken in the order the caller lists them (shuffle them with a
seeded RNG first for a random sample); the plan itself never draws."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def _check_rates(rates: Mapping[str, float]) -> None:
    for name, rate in rates.items():
        if not math.isfinite(rate):
            raise ValueError(f"success rate of {name!r} is not a finite number")


def categories_to_evolve(rates: Mapping[str, float], threshold: float) -> list[str]:
    """The categories whose success rate is strictly below `threshold`,
    worst first, ties by name."""
    _check_rates(rates)
    return sorted((c for c, r in rates.items() if r < threshold), key=lambda c: (rates[c], c))


def failure_sample_plan(
    rates: Mapping[str, float],
    failures_by_category: Mapping[str, Sequence[str]],
    threshold: float,
    budget: int,
    base: int = 2,
) -> dict[str, list[str]]:
    """The failure ids to show per category, in worst-first order.

    Each category to evolve has a quota: `2 * base` when its rate is below
    half the threshold, else `base`, never more than its distinct failures.
    Samples are dealt one per category per round, worst category first, until
    the quotas are met or `budget` samples are dealt. Categories that get no
    sample are left out."""
    if budget < 0 or base < 0:
        raise ValueError("budget and base must not be negative")
    order = categories_to_evolve(rates, threshold)
    pools = {c: list(dict.fromkeys(failures_by_category.get(c, ()))) for c in order}
    quotas = {c: min(len(pools[c]), 2 * base if rates[c] < threshold / 2 else base) for c in order}
    plan: dict[str, list[str]] = {c: [] for c in order}
    dealt = 0
    while dealt < budget:
        progressed = False
        for c in order:
            if dealt >= budget:
                break
            taken = len(plan[c])
            if taken < quotas[c]:
                plan[c].append(pools[c][taken])
                dealt += 1
                progressed = True
        if not progressed:
            break
    return {c: ids for c, ids in plan.items() if ids}
