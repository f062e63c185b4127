"""Parent selection (`parent_selection: pareto`), its pure parts.

Each step builds its candidate from a parent. By default that is the
current skill; with `pareto` it is drawn from the skills the run has
accepted so far (and the skill it started from), the way GEPA draws its
parents: a skill is on the front when it has the top validation score on
at least one task type and no other skill scores at least as well on every
type and better on one. A member is drawn with weight equal to the number
of types it leads, by a draw seeded from the run's seed and the step, so
the same log always gives the same parent.

A skill that wins one kind of task but loses another (a rule that lifts one
type and breaks another) stays reachable this way: a later step may build
on the skill that still holds the other type, instead of only on the last
one accepted. All functions here are deterministic and property-tested
(tests/test_pareto_props.py); the engine calls them in `start_step`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from skillstate.util import derive_seed

# (skill hash, task type -> validation gate score on that type)
Member = tuple[str, Mapping[str, float]]


def _r(x: float) -> float:
    return round(x, 9)


def dominates(a: Mapping[str, float], b: Mapping[str, float], types: Sequence[str]) -> bool:
    """`a` scores at least `b`'s on every type and more on one (a missing type scores 0)."""
    pairs = [(_r(a.get(t, 0.0)), _r(b.get(t, 0.0))) for t in types]
    return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)


def front(pool: Sequence[Member]) -> dict[str, list[str]]:
    """The front: each non-dominated member that leads (ties included) at
    least one task type, with the types it leads, sorted; in pool order. A
    skill listed twice in the pool counts once (its first listing)."""
    seen: dict[str, Mapping[str, float]] = {}
    for skill, scores in pool:
        seen.setdefault(skill, scores)
    types = sorted({t for scores in seen.values() for t in scores})
    out: dict[str, list[str]] = {}
    for skill, scores in seen.items():
        if any(dominates(other, scores, types) for o, other in seen.items() if o != skill):
            continue
        led = [t for t in types if _r(scores.get(t, 0.0)) == max(_r(s.get(t, 0.0)) for s in seen.values())]
        if led:
            out[skill] = led
    return out


def draw(members: Mapping[str, Sequence[str]], seed: int, step: int) -> str:
    """One member, with weight the number of types it leads, by a draw
    seeded from (seed, step); members are taken in the mapping's order."""
    if not members:
        raise ValueError("the front is empty")
    total = sum(len(types) for types in members.values())
    ticket = derive_seed("parent", seed, step) % total
    for skill, types in members.items():
        if ticket < len(types):
            return skill
        ticket -= len(types)
    raise AssertionError("unreachable: the ticket is below the total")  # pragma: no cover
