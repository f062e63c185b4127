"""Repair (`repair: ablate`), its pure parts: which task types a candidate
lost against the current skill, which kept edits to ablate (at most K),
which of them did harm given each ablation's outcomes on the affected
items, and the edits the repaired candidate keeps.

An item's outcome is its gate metric value (hard, soft or mixed, as the gate
compares them). All functions are deterministic and property-tested
(tests/test_repair_props.py); the engine's stage is `skillstate.engine.repair`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skillstate.log.events_repair import EditsAblated

# (task type, candidate's value, current skill's value) of one item scored for both
Paired = tuple[str, float, float]


def may_examine(cfg: Any, p: Any) -> bool:
    """Whether the repair may examine the step's candidate once it is
    evaluated (`cfg` a SkillConfig, `p` the step's progress): repair on, a
    patch step outside bank mode, not repaired yet, two or more selected
    edits. With `repair_full_evaluation`, such a candidate is scored on every
    item (no early reject), so the repair pairs the same outcomes whether
    early reject is on or off, and the decisions stay those of a full
    evaluation."""
    return (cfg.repair == "ablate" and cfg.mode != "bank" and cfg.update_mode == "patch" and p.repair is None
            and p.selected is not None and len(p.selected.edits) >= 2)


def type_changes(items: Sequence[Paired]) -> dict[str, float]:
    """Per task type, the candidate's change against the current skill: the
    mean over the type's items of candidate minus current (rounded to 1e-9,
    so the same outcomes in another order give the same figure)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for task_type, cand, cur in items:
        sums[task_type] = sums.get(task_type, 0.0) + (cand - cur)
        counts[task_type] = counts.get(task_type, 0) + 1
    return {t: round(sums[t] / counts[t], 9) for t in sorted(sums)}


def affected_types(changes: Mapping[str, float], min_loss: float = 0.0) -> list[str]:
    """The types to repair: those the candidate lost by more than `min_loss`
    (`repair_type_loss`), when it also lifted another. A candidate that lifts
    nothing, or loses no type by more than that, has nothing to repair: the
    gate decides it as it is."""
    lost = sorted(t for t, d in changes.items() if d < 0 and -d > min_loss)
    lifted = any(d > 0 for d in changes.values())
    return lost if lost and lifted else []


def choose_ablations(applied: Sequence[int], support: Mapping[int, int], limit: int) -> list[int]:
    """Which of the edits that changed the skill (`applied`, indices in the
    order applied) to ablate, at most `limit`: all of them when they fit,
    else those the fewest analysts proposed (the least corroborated), the
    later applied first among equals. Returned in the order applied. With
    fewer than two applied edits there is nothing to ablate: removing the
    only edit gives back the current skill."""
    if len(applied) < 2 or limit <= 0:
        return []
    if len(applied) <= limit:
        return list(applied)
    ranked = sorted(applied, key=lambda i: (support.get(i, 0), -applied.index(i)))
    chosen = set(ranked[:limit])
    return [i for i in applied if i in chosen]


def recovery(ablated: Sequence[float], candidate: Sequence[float]) -> float:
    """What removing an edit gave back on the affected items: the sum of
    (value without the edit - the candidate's value), item by item."""
    if len(ablated) != len(candidate):
        raise ValueError("ablated and candidate outcomes must cover the same items")
    return sum(a - c for a, c in zip(ablated, candidate, strict=True))


@dataclass(frozen=True)
class Verdict:
    index: int
    recovered: float
    harmful: bool


def verdicts(outcomes: Mapping[int, Sequence[float]], candidate: Sequence[float]) -> list[Verdict]:
    """Each ablated edit's verdict. Harmful is the one edit whose removal
    recovers the affected items the most, when that is above 0 and above
    every other ablation's recovery: the affected items were picked because
    the candidate lost them, so on a noisy target removing any edit (which
    redraws their answers) tends to recover some of them; only a recovery
    that stands out names a culprit. Sums are rounded to 1e-9 so that soft
    scores added in another order give the same verdict."""
    found = {i: round(recovery(outcomes[i], candidate), 9) for i in sorted(outcomes)}
    top = max(found.values(), default=0.0)
    culprits = [i for i, r in found.items() if r == top]
    harmful = culprits[0] if top > 0 and len(culprits) == 1 else None
    return [Verdict(index=i, recovered=r, harmful=i == harmful) for i, r in found.items()]


def to_drop(found: Sequence[Verdict]) -> list[int]:
    """The edits the repaired candidate leaves out: the harmful one (at most one per step)."""
    return sorted(v.index for v in found if v.harmful)


def kept_edits(count: int, dropped: Sequence[int]) -> list[int]:
    """The indices (of the `count` selected edits) the repaired candidate applies, in order."""
    gone = set(dropped)
    return [i for i in range(count) if i not in gone]


def gate_note(r: EditsAblated | None) -> str:
    """What the step's gate reason adds about a repair that dropped edits."""
    if r is None or not r.dropped:
        return ""
    gone = ", ".join(f"edit {a.index} {a.edit.content[:40]!r} ({a.recovered:+g})" for a in r.ablations if a.harmful)
    return f"; repaired: dropped {gone}, which broke {', '.join(r.affected_types)}"
