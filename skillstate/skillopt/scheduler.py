"""Select's edit budget schedule (the textual learning rate), and the data
schedule that cuts each epoch into batches. Both are pure."""

from __future__ import annotations

import math

from skillstate.util import chunked, seeded_rng

SCHEDULERS = ("constant", "linear", "cosine")


def edit_budget(step: int, total_steps: int, max_budget: int, min_budget: int, kind: str) -> int:
    """Budget L for `step` (1-based; step 0 means before training).

    t = step / total_steps; constant: max; linear: max + (min - max) * t;
    cosine: min + (max - min) * (1 + cos(pi * t)) / 2. Rounded half up and
    clamped to [min, max].
    """
    if kind not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {kind!r}")
    t = 0.0 if total_steps <= 0 else min(max(step / total_steps, 0.0), 1.0)
    if kind == "constant":
        value = float(max_budget)
    elif kind == "linear":
        value = max_budget + (min_budget - max_budget) * t
    else:
        value = min_budget + (max_budget - min_budget) * (1 + math.cos(math.pi * t)) / 2
    return int(min(max(math.floor(value + 0.5), min_budget), max_budget))


def steps_per_epoch(n_train: int, batch_size: int, accumulation: int = 1) -> int:
    return max(1, math.ceil(n_train / (batch_size * accumulation)))


def epoch_batches(item_ids: list[str], seed: int, epoch: int, batch_size: int,
                  accumulation: int = 1) -> list[list[str]]:
    """Shuffle train with a seed from (seed, epoch) and cut it into batches.

    Returns steps_per_epoch * accumulation batches: a short epoch is padded
    by reusing its batches from the start, so every epoch has the same number
    of steps.
    """
    ids = list(item_ids)
    seeded_rng("epoch", seed, epoch).shuffle(ids)
    needed = steps_per_epoch(len(ids), batch_size, accumulation) * accumulation
    if not ids:
        return [[] for _ in range(needed)]
    batches = chunked(ids, batch_size)
    base = len(batches)
    while len(batches) < needed:
        batches.append(batches[len(batches) % base])
    return batches


def position(step: int, steps_per_epoch_: int) -> tuple[int, int]:
    """(epoch, index within epoch), both from 1, for a 1-based step."""
    return (step - 1) // steps_per_epoch_ + 1, (step - 1) % steps_per_epoch_ + 1


def clamp_edit_count(value: object, candidates: int) -> int:
    """An autonomous learning-rate reply turned into a number of edits:
    an integer (a float or numeric string is rounded down) clamped to
    [0, candidates]; anything unusable (not a finite number) means 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return 0
    if isinstance(value, float):
        if not math.isfinite(value):
            return 0
        value = math.floor(value)
    if not isinstance(value, int):
        return 0
    return min(max(value, 0), max(candidates, 0))
