"""The minibatch screen's event (`edit_screen: minibatch`): each merged edit left by the screen of edits
that change nothing, applied alone to the current skill and rolled out on a few items of the step's
batch, with what it won and lost there and whether it passed. Registered with the others in
`skillstate.log.event_codec`."""

from __future__ import annotations

from typing import ClassVar

from skillstate.log.events import Edit, Event, ItemResult, Usage, usage_of
from skillstate.log.values import Frozen


class EditTried(Frozen):
    """One merged edit on its minibatch."""

    index: int  # into the step's merged edits (PatchesMerged.edits)
    edit: Edit
    aimed_types: list[str]  # the types its analysts were shown failing (empty: none named it)
    skill: str  # the current skill with this edit alone (blob)
    item_ids: list[str]  # the minibatch's items it was tried on, in batch order
    results: list[ItemResult]  # the edit's outcomes there, in `item_ids` order
    left_out: list[str] = []  # edit_screen_early: the minibatch's items not tried, once it could no longer pass
    failed: int  # how many of the items the current skill failed
    gain: float  # sum over the items of (value with the edit - the current skill's value)
    passed: bool


class EditsScreened(Event):
    """The step's merged edits tried on minibatches before selection; only those that passed compete for
    the budget (by their gain). With no edit to try no call is made and `reason` says why."""

    type: ClassVar[str] = "EditsScreened"
    step: int
    tried: list[EditTried] = []
    reason: str = ""

    def blob_refs(self) -> list[str]:
        return [h for t in self.tried for h in (t.skill, *(r.trajectory for r in t.results if r.trajectory))]

    def usage(self) -> dict[str, Usage]:
        return usage_of([c for t in self.tried for r in t.results for c in r.all_calls()])
