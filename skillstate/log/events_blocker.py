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
    # on the stuck items, in `BlockerSearched.item_ids` order; with `blocker_ablation: group`, only the first
    # ones when the ablation was stopped because it could no longer lift half of them
    results: list[ItemResult]
    score: float  # mean gate value of those results
    lifted: float  # sum over those items of (value without the line - the candidate's value)


class GroupAblation(Frozen):
    """`blocker_ablation: group`: the candidate without every searched line of one clause at once, on the
    stuck items (the first ones only when it was stopped because it could no longer lift half of them).
    Those lines are ablated one by one only when this lifted half the items."""

    lines: list[str]  # the lines of the current skill removed, the most suspect first
    skill: str  # the candidate without them (blob)
    results: list[ItemResult]
    score: float
    lifted: float


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
    # blocker_screened: the edit the screen left out (its index into the merged edits, and the edit) that the
    # search put back, aimed at `task_type`: every ablation, and the candidate it builds, is the current skill
    # with that edit alone (the step's kept edits left out)
    screened_index: int | None = None
    screened_edit: Edit | None = None
    stuck_types: list[str] = []  # ... of those, the ones the candidate left failing on its scored items
    task_type: str | None = None
    item_ids: list[str] = []  # the stuck items: the type's scored items the candidate failed, in split order
    candidate_score: float = 0.0  # the candidate's mean gate value on them
    group: GroupAblation | None = None  # blocker_ablation group: the searched one-clause lines at once, first
    ablations: list[LineAblation] = []
    found: int | None = None
    skill: str | None = None  # the candidate without the blocker (None when nothing is found)
    reason: str = ""

    def blob_refs(self) -> list[str]:
        return ablation_refs(self.candidate_skill, self.skill, [*self.ablations, *([self.group] if self.group else [])])

    def usage(self) -> dict[str, Usage]:
        return ablation_usage([*self.ablations, *([self.group] if self.group else [])])
