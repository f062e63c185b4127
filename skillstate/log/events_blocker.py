"""The blocker search's event (`blocker_search`): the step's candidate did not beat the current skill and
left a task type its edits were aimed at failing; each line (or clause) of the current skill was removed
from the candidate in turn and rolled out on that type's failed items. Registered with the others in
`skillstate.log.event_codec`."""

from __future__ import annotations

from typing import ClassVar

from skillstate.log.events import Edit, Event, ItemResult, Usage
from skillstate.log.events_repair import ablation_refs, ablation_usage
from skillstate.log.values import Frozen


class LineAblation(Frozen):
    """The candidate without one line of the current skill (or one clause of it), on the stuck items."""

    line: str  # the line of the current skill
    part: int | None = None  # the clause of the line left out (None: the whole line)
    edit: Edit  # the edit that removes it: delete the line, or replace it by the rest
    skill: str  # the candidate with that edit applied (blob)
    results: list[ItemResult]  # on the stuck items, in `BlockerSearched.item_ids` order
    score: float  # mean gate value of those results
    lifted: float  # sum over the items of (value without the line - the candidate's value)


class BlockerSearched(Event):
    """The search for a line that holds a task type down. `task_type` is the type searched (None: no type
    the step aimed at was left failing, and no call was made; `reason` says why). `found` indexes the
    ablation that named the blocker; then the candidate with its edit (`skill`) follows as the step's
    `CandidateBuilt` and is evaluated and gated like any other."""

    type: ClassVar[str] = "BlockerSearched"
    step: int
    split: str
    candidate_skill: str  # the candidate searched (after the repair, if any)
    aimed_types: list[str]  # the types the step's kept edits were aimed at
    stuck_types: list[str] = []  # ... of those, the ones the candidate left failing on its scored items
    task_type: str | None = None
    item_ids: list[str] = []  # the stuck items: the type's scored items the candidate failed, in split order
    candidate_score: float = 0.0  # the candidate's mean gate value on them
    ablations: list[LineAblation] = []
    found: int | None = None
    skill: str | None = None  # the candidate without the blocker (None when nothing is found)
    reason: str = ""

    def blob_refs(self) -> list[str]:
        return ablation_refs(self.candidate_skill, self.skill, self.ablations)

    def usage(self) -> dict[str, Usage]:
        return ablation_usage(self.ablations)
