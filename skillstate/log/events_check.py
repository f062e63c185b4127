"""The minibatch gate's event (`minibatch_gate`): the step's candidate rolled out on the step's own batch
and compared with its parent's rollout there, before any validation call. Registered with the others in
`skillstate.log.event_codec`."""

from __future__ import annotations

from typing import ClassVar

from skillstate.log.events import Event, ItemResult, Usage, usage_of


class CandidateChecked(Event):
    """The candidate on the step's batch. It goes on to validation only when it `passed`: its summed item
    values there beat the parent's (the step's rollout) strictly; otherwise the gate rejects it unscored."""

    type: ClassVar[str] = "CandidateChecked"
    step: int
    skill: str  # the candidate (blob)
    item_ids: list[str]  # the step's batch, in order
    results: list[ItemResult]  # the candidate's outcomes there, in `item_ids` order
    parent_total: float  # sum of the parent's item values on the batch (from RolloutCompleted)
    candidate_total: float  # the same sum for the candidate
    passed: bool

    def blob_refs(self) -> list[str]:
        return [self.skill, *(r.trajectory for r in self.results if r.trajectory)]

    def usage(self) -> dict[str, Usage]:
        return usage_of([c for r in self.results for c in r.all_calls()])
