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
from skillstate.log.values import Edit
from skillstate.skillopt import clauses as clause_rules

# (task type, candidate's value, current skill's value) of one item scored for both
Paired = tuple[str, float, float]


def may_examine(cfg: Any, p: Any) -> bool:
    """Whether the repair may examine the step's candidate once it is
    evaluated (`cfg` a SkillConfig, `p` the step's progress): repair on, a
    patch step outside bank mode, not repaired yet, two or more selected
    edits. With `repair_full_evaluation`, such a candidate is scored on every
    item (no early reject), so the repair pairs the same outcomes whether
    early reject is on or off, and the decisions stay those of a full
    evaluation. (A lone edit is not examined even when `repair_clauses` could
    split it: scoring every one-edit candidate in full changed the clean
    world's runs for the worse; bench/results/noisy-clauses.md.)"""
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


def parts(edit: Edit) -> int:
    """How many clauses the repair may leave out of `edit` one at a time
    (`repair_clauses`): the clauses of the text it adds (append, insert
    after, replace) or of the line it deletes; 0 when there are fewer than
    two, as leaving out the only clause is leaving out the edit."""
    text = edit.target if edit.op == "delete" else edit.content
    found = len(clause_rules.clauses(text)) if edit.op in ("append", "insert_after", "replace", "delete") else 0
    return found if found >= 2 else 0


def without_part(edit: Edit, k: int) -> Edit:
    """`edit` without its clause `k`: it adds its text without that clause,
    or, for a delete, deletes the line's other clauses and keeps clause `k`
    (a replace of the line by that clause)."""
    if edit.op == "delete":
        text = edit.target
        for j in reversed(range(len(clause_rules.clauses(edit.target)))):
            if j != k:
                text = clause_rules.without(text, j)
        return edit.model_copy(update={"op": "replace", "content": text})
    return edit.model_copy(update={"content": clause_rules.without(edit.content, k)})


Unit = tuple[int, "int | None"]  # (selected edit index, clause left out or None for the whole edit)


def choose_units(applied: Sequence[int], edits: Sequence[Edit], limit: int, by_clause: bool) -> list[Unit]:
    """What to ablate: the whole edits `choose_ablations` picks (when two or
    more changed the skill) and, with `by_clause`, each clause of every
    chosen edit that joins two or more, in the order applied."""
    whole = choose_ablations(applied, {i: e.support for i, e in enumerate(edits)}, limit)
    out: list[Unit] = []
    for i in whole:
        out.append((i, None))
        if by_clause:
            out += [(i, k) for k in range(parts(edits[i]))]
    return out


def repaired_edits(edits: Sequence[Edit], dropped: Sequence[int], trimmed: Mapping[int, Edit]) -> list[Edit]:
    """The selected edits as the repaired candidate applies them, in order:
    without the `dropped` ones, the `trimmed` ones replaced by what the repair kept of them."""
    gone = set(dropped)
    return [trimmed.get(i, e) for i, e in enumerate(edits) if i not in gone]


def applied_after(edits: Sequence[Edit], repair: EditsAblated | None) -> list[Edit]:
    """The selected `edits` as the candidate built after `repair` (None: no repair) applies them."""
    if repair is None:
        return list(edits)
    trimmed = {a.index: a.kept_as for a in repair.ablations if a.harmful and a.kept_as is not None
               and a.index in repair.trimmed}
    return repaired_edits(edits, repair.dropped, trimmed)


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


def verdicts(outcomes: Mapping[int, Sequence[float]], candidate: Sequence[float],
             units: Sequence[Unit] | None = None) -> list[Verdict]:
    """Each ablation's verdict (keyed as `outcomes`: by edit index, or by
    position in `units` when the ablations include clauses). Harmful is one
    ablation at most: that of the edit whose ablations recover the affected
    items the most, when that is above 0 and above every other edit's: the
    affected items were picked because the candidate lost them, so on a noisy
    target removing any edit (which redraws their answers) tends to recover
    some of them; only a recovery that stands out names a culprit. Within the
    culprit edit, its best clause ablation is chosen over the whole edit's
    when it recovers at least half as much: it explains the damage and keeps
    the rest of the edit. Sums are rounded to 1e-9 so that soft scores added
    in another order give the same verdict."""
    found = {u: round(recovery(outcomes[u], candidate), 9) for u in sorted(outcomes)}
    unit_of = {u: (units[u] if units is not None else (u, None)) for u in found}
    by_edit: dict[int, float] = {}
    for u, r in found.items():
        edit = unit_of[u][0]
        by_edit[edit] = max(r, by_edit.get(edit, r))
    top = max(by_edit.values(), default=0.0)
    leaders = [e for e, r in by_edit.items() if r == top]
    chosen = None
    if top > 0 and len(leaders) == 1:
        mine = [u for u in found if unit_of[u][0] == leaders[0]]
        whole = next((u for u in mine if unit_of[u][1] is None), None)
        part = max((u for u in mine if unit_of[u][1] is not None), key=lambda u: (found[u], -u), default=None)
        if part is not None and found[part] > 0 and (whole is None or 2 * found[part] >= found[whole]):
            chosen = part
        else:
            chosen = whole
    return [Verdict(index=u, recovered=r, harmful=u == chosen) for u, r in found.items()]


def gate_note(r: EditsAblated | None) -> str:
    """What the step's gate reason adds about a repair that dropped edits."""
    if r is None or not (r.dropped or r.trimmed):
        return ""
    gone = ", ".join((f"dropped edit {a.index} {a.edit.content[:40]!r}" if a.part is None else
                      f"left clause {a.part} out of edit {a.index} {a.edit.content[:40]!r}") + f" ({a.recovered:+g})"
                     for a in r.ablations if a.harmful)
    return f"; repaired: {gone}, which broke {', '.join(r.affected_types)}"
