"""Gate: the pure acceptance rule and the gate metric."""

from __future__ import annotations

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
