"""Gate: the pure acceptance rule and the gate metric."""

from __future__ import annotations

from typing import Any

ACCEPT_BEST = "accept_best"
ACCEPT = "accept"
REJECT = "reject"
SKIP = "skip"
ACCEPTED = {ACCEPT_BEST, ACCEPT}


def gate_score(hard: float, soft: float, metric: str, mixed_weight: float = 0.5) -> float:
    """hard, soft, or (1 - w) * hard + w * soft with w clamped to [0, 1]."""
    if metric == "hard":
        return hard
    if metric == "soft":
        return soft
    if metric == "mixed":
        w = min(max(mixed_weight, 0.0), 1.0)
        mixed = (1 - w) * hard + w * soft
        return min(max(mixed, min(hard, soft)), max(hard, soft))  # no rounding drift outside the bounds
    raise ValueError(f"unknown gate metric {metric!r}")


def decide(candidate: float, current: float, best: float) -> str:
    """Accept as new best iff strictly above best; accept iff strictly above
    current; otherwise reject (ties reject)."""
    if candidate > best:
        return ACCEPT_BEST
    if candidate > current:
        return ACCEPT
    return REJECT


# Leading words that make a line a directive, for the semantic-density bonus.
DIRECTIVES = frozenset({"must", "always", "never", "should", "avoid", "only", "do", "don't", "prefer", "require"})


def semantic_density(skill: str) -> float:
    """Share of the skill's content lines (not headings, not blank, not
    markers) whose first word is a directive such as MUST, ALWAYS or NEVER."""
    lines = []
    for raw in skill.splitlines():
        line = raw.strip().lstrip("-*+0123456789.) ").strip()
        if not line or raw.lstrip().startswith(("#", "<!--")):
            continue
        lines.append(line)
    if not lines:
        return 0.0
    directive = sum(1 for line in lines if line.split()[0].strip(":,;.!").lower() in DIRECTIVES)
    return directive / len(lines)


def with_density(score: float, density: float, weight: float, cost: float = 0.0) -> float:
    """The gate score plus the semantic-density bonus, less the length cost (`length_cost`)."""
    return score + weight * density - cost


def gate_of(scores: Any, metric: str, mixed_weight: float, density_weight: float) -> float:
    """The gate metric of recorded `Scores` (hard, soft, density, length_cost): the one formula the gate,
    the score cache, the reducer and the final selection share."""
    return with_density(gate_score(scores.hard, scores.soft, metric, mixed_weight), scores.density, density_weight,
                        scores.length_cost)


def length_cost(skill: str, penalty: float) -> float:
    """The gate metric's length penalty (`gate_length_penalty`): `penalty` per 100 characters of the skill."""
    return penalty * len(skill) / 100 if penalty else 0.0


# --- early reject ------------------------------------------------------------------
# Rounding slack for the metrics whose sums are not exact in floating point (soft, mixed, the density bonus):
# a reject is called early only when the bound is below the current score by more than this.
ROUNDING_SLACK = 1e-9


def upper_bound(hard_sum: float, soft_sum: float, scored: int, n: int, metric: str, mixed_weight: float,
                density: float, density_weight: float, cost: float = 0.0) -> float:
    """The best gate score a candidate can still reach after `scored` of `n`
    items: every item left scoring 1 (each item's hard and soft lie in [0, 1],
    and the gate score rises with both). The length cost is the skill's,
    known before any item is scored."""
    left = n - scored
    return with_density(gate_score((hard_sum + left) / n, (soft_sum + left) / n, metric, mixed_weight), density,
                        density_weight, cost)


def reject_is_certain(bound: float, current: float, exact: bool) -> bool:
    """Whether a candidate bounded by `bound` cannot beat `current` (the gate
    accepts only strictly above it). `exact`: every sum behind the bound is
    exact in floating point (the hard metric on 0/1 scores, no density
    bonus), so the comparison is too; otherwise it keeps a rounding slack."""
    return bound <= current if exact else bound <= current - ROUNDING_SLACK


def early_reject_point(outcomes: list[tuple[float, float]], n: int, current: float, metric: str,
                       mixed_weight: float, density: float, density_weight: float,
                       cost: float = 0.0) -> tuple[int, float] | None:
    """(k, bound): the fewest items, scored in the given order, after which a
    reject is certain, and the bound that proves it; None when no prefix of
    `outcomes` (the (hard, soft) of each item, in evaluation order) proves
    one. The last item is never used: with every item scored the gate
    decides from the full score as usual."""
    hard_sum = soft_sum = 0.0
    exact = metric == "hard" and density_weight == 0 and cost == 0
    for k, (hard, soft) in enumerate(outcomes[: n - 1], 1):
        hard_sum += hard
        soft_sum += soft
        exact = exact and hard in (0.0, 1.0)
        bound = upper_bound(hard_sum, soft_sum, k, n, metric, mixed_weight, density, density_weight, cost)
        if reject_is_certain(bound, current, exact):
            return k, bound
    return None


def reject_after(outcomes: list[tuple[float, float]], n: int, current: float, metric: str, mixed_weight: float,
                 density: float, density_weight: float, cost: float = 0.0) -> tuple[int, float] | None:
    """(len(outcomes), bound) when the whole of `outcomes` proves a reject,
    else None: `early_reject_point`'s test at that one prefix, with the same
    sums in the same order. For a caller that extends the prefix an item at
    a time and stops at the first proof (no shorter prefix proved one), the
    first prefix this accepts is the one `early_reject_point` finds, with the
    same bound, in one bound per item instead of one per prefix item."""
    k = len(outcomes)
    if k == 0 or k >= n:  # the last item is never used: a full evaluation decides as usual
        return None
    hard_sum = soft_sum = 0.0
    exact = metric == "hard" and density_weight == 0 and cost == 0
    for hard, soft in outcomes:
        hard_sum += hard
        soft_sum += soft
        exact = exact and hard in (0.0, 1.0)
    bound = upper_bound(hard_sum, soft_sum, k, n, metric, mixed_weight, density, density_weight, cost)
    return (k, bound) if reject_is_certain(bound, current, exact) else None
