"""The minibatch screen (`edit_screen: minibatch`), its pure parts: the train items each merged edit is
tried on, whether it passes, and the order the edits that pass compete for the budget in.

As GEPA accepts a candidate on a minibatch before its full evaluation, each edit here is applied alone to
the current skill and rolled out on a few items of the step's batch: failures its analysts were shown, of
the task types they aimed it at (those their failure summary names), and one item of another type that
the current skill got right (to see an edit that breaks something else). The current skill's outcomes on
them are the step's rollout, so only the edit's side costs calls. An edit passes when it wins back more
than half of the failures of one of its types, net, and gains on the whole minibatch. The edits that pass
compete for the budget by their gain, not by the ranking call. With `edit_screen_early`, an edit is first
tried on one failure of each of its types (`first_round`) and on the rest only while it could still pass
(`may_pass`): the edits that pass are tried on the whole minibatch, so the same edits pass with the same
gains, for fewer calls. Deterministic and property-tested
(tests/test_minibatch_props.py); the engine's stage is `skillstate.engine.edit_screen`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from skillstate.util import seeded_rng

Outcome = tuple[str, str, float]  # (item id, task type, the current skill's value) of a batch item
MAX_TYPES = 2  # an edit is tried on the failures of at most this many of the types it was aimed at


def minibatch(aims: Mapping[str, Sequence[str]], batch: Sequence[Outcome], per_type: int, seed: int, step: int,
              index: int, others: int = 1) -> list[str]:
    """The items edit `index` of step `step` is tried on, in batch order. For each type it was aimed at
    (`aims`: type -> the failures of that type its analysts were shown; at most MAX_TYPES, those with the
    most failures first, then by name), up to `per_type` of those failures; with no aim, `per_type` failed
    items of any type. Then `others` items of types not aimed at that the current skill got right. Each
    group is drawn in a shuffle seeded by (seed, step, index)."""
    rng = seeded_rng("edit-screen", seed, step, index)
    position = {item_id: n for n, (item_id, _, _) in enumerate(batch)}
    value = {item_id: v for item_id, _, v in batch}
    chosen: list[str] = []
    types = sorted(aims, key=lambda t: (-len(aims[t]), t))[:MAX_TYPES]
    for t in types:
        ids = [i for i in aims[t] if i in position and value[i] < 1]
        rng.shuffle(ids)
        chosen += ids[:per_type]
    if not types:
        ids = [i for i, _, v in batch if v < 1]
        rng.shuffle(ids)
        chosen += ids[:per_type]
    solved = [i for i, t, v in batch if v >= 1 and t not in aims]
    rng.shuffle(solved)
    chosen += solved[:others]
    return sorted(dict.fromkeys(chosen), key=lambda i: position[i])


def net(tried: Sequence[float], current: Sequence[float]) -> float:
    """What the edit won back less what it lost on its minibatch: the sum of (value with it - without it),
    rounded to 1e-9 (the same outcomes in another order give the same figure)."""
    if len(tried) != len(current):
        raise ValueError("the edit's and the current skill's outcomes must cover the same items")
    return round(sum(t - c for t, c in zip(tried, current, strict=True)), 9)


def passes(outcomes: Sequence[tuple[str, float, float]], aimed: Sequence[str]) -> bool:
    """Whether an edit passes, from (task type, value with it, without it) of its minibatch: on the failed
    items of some type it was aimed at (of any type when none was named) it won back more than half, net,
    and it gained on the whole minibatch."""
    groups: dict[str, tuple[float, int]] = {}
    for t, tried, current in outcomes:
        if current < 1 and (not aimed or t in aimed):
            key = t if aimed else ""
            gain, n = groups.get(key, (0.0, 0))
            groups[key] = (gain + tried - current, n + 1)
    total = net([x for _, x, _ in outcomes], [c for _, _, c in outcomes])
    return total > 0 and any(2 * round(gain, 9) > n for gain, n in groups.values())


def first_round(minibatch: Sequence[tuple[str, str, float]], aimed: Sequence[str]) -> list[str]:
    """The items an edit is tried on first, from its minibatch as (item id, task type, the current skill's
    value), in that order: the first failure of each type it was aimed at (of any type when none was named),
    the failures that decide whether it passes."""
    seen: set[str] = set()
    out: list[str] = []
    for item_id, t, current in minibatch:
        key = t if aimed else ""
        if current < 1 and (not aimed or t in aimed) and key not in seen:
            seen.add(key)
            out.append(item_id)
    return out


def may_pass(tried: Sequence[tuple[str, float, float]], left: Sequence[tuple[str, float]],
             aimed: Sequence[str]) -> bool:
    """Whether an edit could still pass (`passes`), from its outcomes so far as (task type, value with it,
    without it) and the items left as (task type, value without it): the best it can do is win every item
    left (a value is at most 1)."""
    return passes([*tried, *((t, 1.0, current) for t, current in left)], aimed)


def ranked(indices: Sequence[int], gains: Sequence[float]) -> list[int]:
    """The edits that passed (`indices`, in merge order, with their `gains`) in the order they compete for
    the budget: the largest gain first, merge order among equals."""
    return [i for _, _, i in sorted((-g, n, i) for n, (i, g) in enumerate(zip(indices, gains, strict=True)))]
