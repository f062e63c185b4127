"""Finding the blocker (`blocker_search`), its pure parts: which task types a step's edits were aimed at,
which of them the candidate leaves failing, which lines (and clauses) of the current skill to ablate and
in what order, the edit that removes one, and which ablation, if any, names the line that holds the type
down.

A broad line ("keep answers terse; never reformat") can override a specific rule, so an edit aimed at a
type shows no gain while that line stays. The search takes the candidate (the new edits applied) without
each line of the current skill in turn, rolls it out on the type's items the candidate failed, and names
the line whose removal lifts them, when that lift stands out. All functions are deterministic and
property-tested (tests/test_blocker_props.py); the engine's stage is `skillstate.engine.blockers`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from skillstate.log.values import Edit
from skillstate.skillopt import clauses as clause_rules
from skillstate.skillopt.screen import edit_key

STUCK = 0.5  # a type the candidate still fails on more than half its scored items is left failing
Unit = tuple[int, "int | None"]  # (index into the lines searched, clause left out or None for the whole line)


# One failure analyst's patch as the aims read it: its edits, the (item id, task type) of each failure it was
# shown, and the lines of its failure summary.
Patch = tuple[Sequence[Edit], Sequence[tuple[str, str]], Sequence[str]]


def named_types(texts: Sequence[str], types: Sequence[str]) -> list[str]:
    """The task types among `types` that `texts` name: the type's name (its underscores read as spaces) in
    any of them, case aside; in the order they are first named, then by name."""
    joined = " ".join(t.lower().replace("_", " ") for t in texts)
    found = [(joined.find(t.lower().replace("_", " ")), t) for t in set(types) if t]
    return [t for at, t in sorted(found) if at >= 0]


def patch_aims(failures: Sequence[tuple[str, str]], texts: Sequence[str]) -> list[str]:
    """The types an analyst aimed its edits at: those its failure summary names among the types of the
    failures it was shown; when it names none, the commonest of those types (all that tie)."""
    types = [t for _, t in failures]
    named = named_types(texts, types)
    if named or not types:
        return named
    counts = Counter(types)
    top = max(counts.values())
    return sorted(t for t, n in counts.items() if n == top)


def aimed_items(patches: Sequence[Patch], kept: Sequence[Edit]) -> dict[str, list[str]]:
    """What the `kept` edits were aimed at: each type the analysts that proposed one of them (compared as
    the screen compares edits) aimed their patch at, with the failures of that type they were shown (item
    ids in the order of the patches, each once). Types sorted."""
    keys = {edit_key(e) for e in kept}
    out: dict[str, list[str]] = {}
    for edits, failures, texts in patches:
        if not any(edit_key(e) in keys for e in edits):
            continue
        for t in patch_aims(failures, texts):
            ids = out.setdefault(t, [])
            ids += [i for i, u in failures if u == t and i not in ids]
    return {t: out[t] for t in sorted(out)}


def aimed_types(patches: Sequence[Patch], kept: Sequence[Edit]) -> list[str]:
    """The task types the `kept` edits were aimed at (`aimed_items`' types)."""
    return list(aimed_items(patches, kept))


def stuck_types(aimed: Sequence[str], outcomes: Sequence[tuple[str, float]], min_failed: int = 2) -> list[str]:
    """Of the `aimed` types, those the candidate leaves failing: on its scored items of the type
    (`outcomes`: (task type, the candidate's value) of each), a mean of at most STUCK, with at least
    `min_failed` items below 1. Ordered by the most such items first, then by name."""
    values: dict[str, list[float]] = {}
    for task_type, value in outcomes:
        values.setdefault(task_type, []).append(value)
    found = []
    for t in set(aimed):
        vs = values.get(t, [])
        failed = sum(1 for v in vs if v < 1)
        if vs and failed >= min_failed and sum(vs) / len(vs) <= STUCK:
            found.append((-failed, t))
    return [t for _, t in sorted(found)]


def screened_out(tried: Sequence[tuple[int, Sequence[str], float, bool]], outcomes: Sequence[tuple[str, float]],
                 kept: Sequence[int]) -> tuple[int, str] | None:
    """The edit the screen left out to put back for the search (`blocker_screened`), and the type to search:
    of the screen's tries (merged index, aimed types, gain, passed) that did not pass and are not among the
    `kept` merged indices, those aimed at a type the candidate leaves failing (`stuck_types` on `outcomes`).
    The type with the most failed items first (then by name), and for it the edit with the largest gain
    (then the first merged)."""
    out = [(index, types, gain) for index, types, gain, passed in tried if not passed and index not in set(kept)]
    stuck = stuck_types([t for _, types, _ in out for t in types], outcomes)
    if not stuck:
        return None
    aimed = [(round(-gain, 9), index) for index, types, gain in out if stuck[0] in types]
    return min(aimed)[1], stuck[0]


def low_types(by_type: Mapping[str, float], outcomes: Sequence[tuple[str, float]], min_failed: int = 2) -> list[str]:
    """The task types a skill leaves low (the prune's test, `prune_blockers`): a gate score of at most STUCK
    (`by_type`) with at least `min_failed` items below 1 (`outcomes`: (task type, value) of each scored item);
    the lowest first, then by name."""
    failed: dict[str, int] = {}
    for t, v in outcomes:
        if v < 1:
            failed[t] = failed.get(t, 0) + 1
    return [t for _, t in sorted((score, t) for t, score in by_type.items()
                                 if score <= STUCK and failed.get(t, 0) >= min_failed)]


def suspicion(lines: Sequence[str], initial: Sequence[str],
              changes: Sequence[tuple[Sequence[str], float]]) -> list[int]:
    """The order to ablate `lines` in: first the lines that arrived in a step where the type's score fell
    the most (`changes`: each accepted skill's lines and the type's change against the skill before, in
    order), lines of the `initial` skill and lines of unknown origin after those that fell (change 0), then
    those that arrived with a rise; among equals, the order of `lines`."""
    held = set(initial)
    arrived: dict[str, float] = {}
    for skill_lines, change in changes:
        for line in skill_lines:
            if line not in held and line not in arrived:
                arrived[line] = change
        held |= set(skill_lines)
    return sorted(range(len(lines)), key=lambda i: (round(arrived.get(lines[i], 0.0), 9), i))


def units(lines: Sequence[str], order: Sequence[int], max_lines: int) -> list[Unit]:
    """What to ablate: the first `max_lines` lines in `order`, each whole and, when it joins two or more
    clauses, without each clause in turn."""
    out: list[Unit] = []
    for i in list(order)[:max_lines]:
        out.append((i, None))
        found = len(clause_rules.clauses(lines[i]))
        if found >= 2:
            out += [(i, k) for k in range(found)]
    return out


def deletion(line: str, part: int | None) -> Edit:
    """The edit that removes `line` (part None) or its clause `part` (the line is replaced by the rest)."""
    if part is None:
        return Edit(op="delete", target=line, content="", source="blocker", support=0)
    return Edit(op="replace", target=line, content=clause_rules.without(line, part), source="blocker", support=0)


def verdict(lifts: Sequence[float], found_units: Sequence[Unit], items: int) -> int | None:
    """Which ablation names the blocker (an index into `found_units`), or None. `lifts`: what each
    ablation gave back on the `items` stuck items (sum of value without the line minus the candidate's).
    A line names it when its best ablation lifts at least half the items, uniquely the most, and by at least
    a third of the items (one at the least) more than any other line's: removing any line redraws a noisy
    target's answers, so only a lift that stands out names a blocker. Within that line, its best clause is
    chosen over the whole line when it lifts at least half as much (the rest of the line stays). Lifts are
    rounded to 1e-9, so the same outcomes summed in another order give the same verdict."""
    if not found_units or items <= 0:
        return None
    rounded = [round(x, 9) for x in lifts]
    best: dict[int, float] = {}
    for (line, _), lift in zip(found_units, rounded, strict=True):
        best[line] = max(lift, best.get(line, lift))
    ranked = sorted(best.values(), reverse=True)
    top, runner = ranked[0], (ranked[1] if len(ranked) > 1 else 0.0)
    leaders = [line for line, lift in best.items() if lift == top]
    if len(leaders) != 1 or 2 * top < items or top - runner < max(1.0, items / 3):
        return None
    mine = [u for u, (line, _) in enumerate(found_units) if line == leaders[0]]
    whole = next(u for u in mine if found_units[u][1] is None)
    parts = [u for u in mine if found_units[u][1] is not None]
    part = max(parts, key=lambda u: (rounded[u], -u), default=None)
    if part is not None and rounded[part] > 0 and 2 * rounded[part] >= rounded[whole]:
        return part
    return whole


def may_stand_out(ablated: Sequence[float], candidate: Sequence[float]) -> bool:
    """Whether an ablation rolled out on the first len(`ablated`) of the stuck items (whose values without it
    are `candidate`, all of them) could still lift half of them, as `verdict` asks of the line it names, if it
    won every item left. `blocker_ablation: group` stops rolling out an ablation once this is false."""
    if len(ablated) > len(candidate):
        raise ValueError("more ablated outcomes than stuck items")
    done = len(ablated)
    best = lift(ablated, candidate[:done]) + sum(1.0 - c for c in candidate[done:])
    return 2 * round(best, 9) >= len(candidate) > 0


def live(outcomes: Sequence[Sequence[float]], candidate: Sequence[float], lines: Sequence[int] | None) -> list[int]:
    """The ablations `blocker_ablation: group` goes on rolling out, from each one's outcomes so far on the first
    of the stuck items (whose values without any removal are `candidate`). With `lines` (the line each ablation
    removes, whole or a clause), an ablation goes on while any ablation of its line may still stand out: the
    line `verdict` names then has every ablation rolled out on every item, so its clause is chosen against its
    whole line as the full search chooses it. Without (runs logged before), each ablation on its own."""
    standing = [may_stand_out(o, candidate) for o in outcomes]
    if lines is None:
        return [u for u, up in enumerate(standing) if up]
    alive = {line for line, up in zip(lines, standing, strict=True) if up}
    return [u for u, line in enumerate(lines) if line in alive]


def lift(ablated: Sequence[float], candidate: Sequence[float]) -> float:
    """What an ablation gave back on the stuck items: the sum of (value without the line - the candidate's)."""
    if len(ablated) != len(candidate):
        raise ValueError("ablated and candidate outcomes must cover the same items")
    return sum(a - c for a, c in zip(ablated, candidate, strict=True))


def single_clause_lines(lines: Sequence[str], found_units: Sequence[Unit]) -> list[int]:
    """The lines among `found_units` (indexes into `lines`, in their order) that are ablated whole only: those
    `units` did not split into clauses."""
    split = {i for i, k in found_units if k is not None}
    return [i for i, k in found_units if k is None and i not in split]


def group_lifts(lifted: float, items: int) -> bool:
    """Whether the ablation of every searched one-clause line at once (`blocker_ablation: group`) lifted the `items`
    stuck items enough for one of its lines to be searched for: at least half of them, as `verdict` asks."""
    return items > 0 and 2 * round(lifted, 9) >= items


def stuck_items(scored: Sequence[tuple[str, str, float]], task_type: str, limit: int) -> list[str]:
    """The items to ablate on: of the scored items (item id, task type, the candidate's value) in the
    order given, the first `limit` of `task_type` that the candidate failed (value below 1)."""
    return [i for i, t, v in scored if t == task_type and v < 1][:limit]


def note(found: str | None, task_type: str | None, gained: float) -> str:
    """What the step's gate reason adds about a blocker the search removed."""
    if not found or task_type is None:
        return ""
    return f"; unblocked {task_type}: removed {found[:60]!r} ({gained:+g})"


def by_type_change(before: Mapping[str, float] | None, after: Mapping[str, float] | None, task_type: str) -> float:
    """The change of one type's score between two skills' scores by type (0 when either lacks it)."""
    if not before or not after or task_type not in before or task_type not in after:
        return 0.0
    return round(after[task_type] - before[task_type], 9)
