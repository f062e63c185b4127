"""The events of an epoch's boundary: the comparison of the previous
epoch's skill with the current one, the slow update (proposed and
decided), the meta skill's memo, the epoch's end, and the final validation
of a run with the slow update. Registered with the others in
`skillstate.log.event_codec`."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from skillstate.log.events import Event
from skillstate.log.values import CallRef, ItemResult, PartialEval, Scores, Usage, usage_of


class EpochCompared(Event):
    """The previous epoch's skill and the current one, rolled out on the same items."""

    type: ClassVar[str] = "EpochCompared"
    epoch: int
    previous_skill: str
    skill: str
    item_ids: list[str]
    previous_results: list[ItemResult]
    results: list[ItemResult]
    labels: dict[str, str]  # item id -> improved | regressed | persistent_fail | stable_success

    def blob_refs(self) -> list[str]:
        rs = self.previous_results + self.results
        return [self.previous_skill, self.skill, *(r.trajectory for r in rs if r.trajectory)]

    def usage(self) -> dict[str, Usage]:
        return usage_of([c for r in self.previous_results + self.results for c in r.all_calls()])


class SlowUpdateProposed(Event):
    type: ClassVar[str] = "SlowUpdateProposed"
    epoch: int
    status: str  # ok | unparseable | error
    guidance: str = ""
    reasoning: str = ""
    skill: str | None = None  # the current skill with the new guidance block (None when unusable)
    call: CallRef | None = None

    def blob_refs(self) -> list[str]:
        return [self.skill] if self.skill else []

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class SlowUpdateDecided(Event):
    type: ClassVar[str] = "SlowUpdateDecided"
    epoch: int
    decision: str  # accept_best | accept | reject | skip; forced acceptance is `accept` with forced=True
    forced: bool
    candidate_score: float | None
    current_score: float  # before the decision
    best_score: float
    scores: Scores | None = None
    cached: bool = False
    results: str | None = None
    reason: str = ""
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)
    partial: PartialEval | None = None  # early reject: `scores` cover only the items scored

    def blob_refs(self) -> list[str]:
        return [self.results] if self.results else []

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role


class MetaSkillWritten(Event):
    type: ClassVar[str] = "MetaSkillWritten"
    epoch: int
    status: str  # ok | unparseable | error (then the previous memo stays)
    memo: str = ""
    call: CallRef | None = None

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class EpochEnded(Event):
    type: ClassVar[str] = "EpochEnded"
    epoch: int
    skill: str  # the current skill the next epoch starts from

    def blob_refs(self) -> list[str]:
        return [self.skill]


class FinalValidated(Event):
    """use_slow_update: the final current skill is promoted to best if it beats it."""

    type: ClassVar[str] = "FinalValidated"
    skill: str
    score: float | None
    best_score: float
    promoted: bool

    def blob_refs(self) -> list[str]:
        return [self.skill]
