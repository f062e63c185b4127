"""GRPO's group-relative advantages: A_i = (R_i - mean R) / std R over the G
completions of one prompt, with the sample standard deviation (divisor
G - 1), as TRL's GRPOTrainer computes it (torch's `std`). TRL adds 1e-4 to
the divisor; here a group whose rewards are all equal gets zeros instead,
and so does a group of one, whose sample deviation is undefined."""

from __future__ import annotations

import math
from collections.abc import Sequence

ZERO_STD = 1e-12


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """The advantages of one group. A group whose rewards are all equal (std
    at most 1e-12), and a group of one, gets zeros, never NaN. Raises
    ValueError on a non-finite reward."""
    if any(not math.isfinite(r) for r in rewards):
        raise ValueError("rewards must be finite numbers")
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    # Deviations from the smallest reward first: for close rewards of large
    # magnitude those differences are exact, so the mean is not lost in
    # rounding, and a group of equal rewards gives exact zeros.
    low = min(rewards)
    shifted = [r - low for r in rewards]
    mean = math.fsum(shifted) / n
    deviations = [x - mean for x in shifted]
    scale = max(abs(d) for d in deviations)
    if scale <= ZERO_STD:
        return [0.0] * n
    # Scaled first, so that squaring large rewards cannot overflow.
    std = scale * math.sqrt(math.fsum((d / scale) ** 2 for d in deviations) / (n - 1))
    if std <= ZERO_STD:
        return [0.0] * n
    return [d / std for d in deviations]
