"""The repair's event (`repair: ablate`): which task types the candidate
lost, each ablated edit's outcomes on the items of those types, and the
edits dropped. Registered with the others in `skillstate.log.event_codec`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from skillstate.log.events import Edit, Event, ItemResult, Usage, usage_of
from skillstate.log.values import Frozen


class Ablated(Protocol):
    """An ablation of an edit or of a line: the skill without it, and its rollouts."""

    @property
    def skill(self) -> str: ...

    @property
    def results(self) -> list[ItemResult]: ...


def ablation_refs(candidate: str, found: str | None, ablations: Sequence[Ablated]) -> list[str]:
    """The blobs an ablation event names: the candidate, the skill it found (if any), and each ablation's skill
    and trajectories."""
    refs = [candidate] + ([found] if found else [])
    for a in ablations:
        refs += [a.skill, *(r.trajectory for r in a.results if r.trajectory)]
    return refs


def ablation_usage(ablations: Sequence[Ablated]) -> dict[str, Usage]:
    return usage_of([c for a in ablations for r in a.results for c in r.all_calls()])


class EditAblation(Frozen):
    """The candidate without one of its edits, rolled out on the affected items."""

    index: int  # into the step's selected edits (EditsSelected.edits)
    edit: Edit
    part: int | None = None  # repair_clauses: the clause of the edit left out (None: the whole edit)
    kept_as: Edit | None = None  # ... and the edit as applied without it
    skill: str  # the candidate without this edit (blob)
    results: list[ItemResult]  # on the affected items, in `EditsAblated.item_ids` order
    score: float  # mean gate value of those results
    recovered: float  # sum over the items of (value without the edit - the candidate's value)
    harmful: bool  # recovered > 0: the affected items do better without it


class EditsAblated(Event):
    """The step's candidate lost some task types while lifting others: its
    kept edits (at most `repair_max_edits`) were each removed in turn and the
    result rolled out on the items of the lost types. The edits whose removal
    recovered those items are dropped; when any is, the repaired candidate
    (`skill`) follows as the step's `CandidateBuilt` and is evaluated and
    gated like any other. With no lost type, or no reference to pair with,
    no call is made and `reason` says why."""

    type: ClassVar[str] = "EditsAblated"
    step: int
    split: str
    candidate_skill: str  # the candidate before repair
    changes: dict[str, float]  # task type -> mean change of the candidate against the current skill (scored items)
    affected_types: list[str]
    item_ids: list[str]  # the affected items: the scored items of the affected types, in split order
    current_score: float = 0.0  # mean gate value of the current skill on the affected items
    candidate_score: float = 0.0  # the same for the candidate
    ablations: list[EditAblation] = []
    dropped: list[int] = []  # indices into the selected edits
    trimmed: list[int] = []  # ... of the edits applied without a clause (their ablation's `kept_as`)
    skill: str | None = None  # the repaired candidate (None when nothing is dropped)
    reason: str = ""

    def blob_refs(self) -> list[str]:
        return ablation_refs(self.candidate_skill, self.skill, self.ablations)

    def usage(self) -> dict[str, Usage]:
        return ablation_usage(self.ablations)
