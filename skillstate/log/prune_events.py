"""The events of pruning (config key `prune`): a proposal to delete lines of
the current skill, and the gate's decision on it. Registered with the others
in `skillstate.log.event_codec`; folded by `skillstate.log.prune_fold`."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from skillstate.log.events import Event, PairedTest, TypeGuard
from skillstate.log.events_blocker import LineAblation
from skillstate.log.values import ApplyEntry, CallRef, Edit, Frozen, PartialEval, Scores, Usage, usage_of


class PruneLine(Frozen):
    """A line proposed for deletion and why: `duplicate` or `near_duplicate`
    (of the line `of`, which stays) or `optimizer` (the prune prompt's reply)."""

    line: str
    reasons: list[str]
    of: str = ""


class PruneProposed(Event):
    type: ClassVar[str] = "PruneProposed"
    after_step: int  # the step after which the prune runs
    epoch: int
    base_skill: str  # the current skill
    skill: str | None = None  # the current skill without the lines (None: nothing to delete)
    lines: list[PruneLine] = Field(default_factory=list)
    edits: list[Edit] = Field(default_factory=list)  # the delete edits, as the editor applied them
    report: list[ApplyEntry] = Field(default_factory=list)
    status: str = "ok"  # the optimizer's reply: ok | unparseable | error
    reasoning: str = ""
    call: CallRef | None = None
    # prune_blockers: the lowest task type on val, its failed items, each line of the skill removed and rolled
    # out on them, and the ablation that named a line holding it down (its edit is among `edits`). Left out of
    # the stored payload when no type was tested, so a proposal without the test reads as it always did.
    blocked_type: str | None = None
    type_items: list[str] = Field(default_factory=list)
    type_ablations: list[LineAblation] = Field(default_factory=list)
    type_found: int | None = None

    @model_serializer(mode="wrap")
    def _without_type_test_when_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if data.get("blocked_type") is None:
            for key in ("blocked_type", "type_items", "type_ablations", "type_found"):
                data.pop(key, None)
        return data

    def blob_refs(self) -> list[str]:
        refs = [self.base_skill] + ([self.skill] if self.skill else [])
        for a in self.type_ablations:
            refs += [a.skill, *(r.trajectory for r in a.results if r.trajectory)]
        return refs

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call, *(c for a in self.type_ablations for r in a.results for c in r.all_calls())])


class PruneDecided(Event):
    type: ClassVar[str] = "PruneDecided"
    after_step: int
    epoch: int
    decision: str  # accept_best | accept | reject | skip
    candidate_score: float | None
    current_score: float  # before the decision
    best_score: float
    scores: Scores | None = None
    cached: bool = False
    results: str | None = None
    partial: PartialEval | None = None  # early reject: `scores` cover only the items scored
    reason: str = ""
    rule: str = "strict"
    paired: PairedTest | None = None
    type_guard: TypeGuard | None = None
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)

    def blob_refs(self) -> list[str]:
        return [self.results] if self.results else []

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role
