"""Splitting evals into train, val and test: pure, and the same for the same seed.

Each item's place depends only on the seed and its id (a hash of both orders the items), not on its
position in the file: adding an eval moves few others. Each split keeps the items in the order they
were given.

The sizes are shares (floats that add up to 1) or counts (ints; items beyond their sum are left out).
The default, `DEFAULT_SIZES`, is 60 % train, 20 % val and 20 % test. Every split gets at least one
item, so shares need at least three evals and counts at least their sum; fewer is one `DataError`
line that says how many are needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from skillstate.errors import DataError, UserError
from skillstate.util import derive_seed

T = TypeVar("T")
Sizes = tuple[float, float, float]  # (train, val, test): shares, or counts as ints
DEFAULT_SIZES: Sizes = (0.6, 0.2, 0.2)
SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class Splits(Generic[T]):
    train: list[T]
    val: list[T]
    test: list[T]

    def as_dict(self) -> dict[str, list[T]]:
        return {"train": self.train, "val": self.val, "test": self.test}


def _item_key(item: Any) -> str:
    return str(getattr(item, "id", item))


def split_sizes(n: int, sizes: Sequence[float] = DEFAULT_SIZES, source: str = "the evals") -> tuple[int, int, int]:
    """How many of `n` items go to train, val and test; `UserError` for sizes that are not three
    positive shares adding up to 1 or three counts of 1 or more, `DataError` for too few items."""
    if len(sizes) != 3:
        raise UserError(f"split sizes are three numbers (train, val, test), not {len(sizes)}")
    if any(isinstance(s, bool) or not isinstance(s, (int, float)) for s in sizes):
        raise UserError(f"split sizes are numbers: {list(sizes)!r}")
    if all(isinstance(s, int) for s in sizes):
        counts = tuple(int(s) for s in sizes)
        if min(counts) < 1:
            raise UserError(f"split counts must each be 1 or more: {list(counts)}")
        if sum(counts) > n:
            raise DataError(f"{source}: needs at least {sum(counts)} evals for train, val and test "
                            f"({counts[0]}, {counts[1]}, {counts[2]}); the file has {n}")
        return counts[0], counts[1], counts[2]
    shares = [float(s) for s in sizes]
    if any(not math.isfinite(s) or s <= 0 for s in shares) or not math.isclose(sum(shares), 1.0, abs_tol=1e-6):
        raise UserError(f"split shares must be three numbers above 0 that add up to 1 (or three counts): "
                        f"{list(sizes)!r}")
    if n < 3:
        raise DataError(f"{source}: needs at least 3 evals for train, val and test; the file has {n}")
    # Largest remainders, with at least one item each.
    raw = [s * n for s in shares]
    counts_list = [max(1, math.floor(r)) for r in raw]
    while sum(counts_list) > n:  # the floors of 1 took more than there is: take back from the split most over its share
        i = max((k for k in range(3) if counts_list[k] > 1), key=lambda k: (counts_list[k] - raw[k], -k))
        counts_list[i] -= 1
    while sum(counts_list) < n:
        i = max(range(3), key=lambda k: (raw[k] - counts_list[k], -k))
        counts_list[i] += 1
    return counts_list[0], counts_list[1], counts_list[2]


def split_evals(items: Sequence[T], seed: int, sizes: Sequence[float] = DEFAULT_SIZES, *,
                key: Callable[[T], str] = _item_key, source: str = "the evals") -> Splits[T]:
    """`items` split into train, val and test by `seed`. `key` names an item (its `id`); `source`
    names the file in the refusal."""
    n_train, n_val, n_test = split_sizes(len(items), sizes, source)
    ranked = sorted(range(len(items)), key=lambda i: derive_seed("evals-split", seed, key(items[i])))
    val = set(ranked[:n_val])
    test = set(ranked[n_val:n_val + n_test])
    train = set(ranked[n_val + n_test:n_val + n_test + n_train])
    return Splits([x for i, x in enumerate(items) if i in train], [x for i, x in enumerate(items) if i in val],
                  [x for i, x in enumerate(items) if i in test])
