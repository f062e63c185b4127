"""The immutable events of a run.

Every stage of the engine emits events; they are the only truth about a run.
Each event class has a `type` name and a schema `version`. Stored rows are
never rewritten: an event stored under an older version is upcast on read by
the functions in `UPCASTERS`.

Large texts (skills, trajectories, prompts, raw replies) are not stored in
events: events hold the sha256 of a row in the blob table.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from skillstate.errors import CorruptLogError


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Usage(Frozen):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            calls=self.calls + other.calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


class CallRef(Frozen):
    """One LLM request the event depended on (full text in the call table)."""

    request_hash: str
    role: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


class Edit(Frozen):
    op: str
    target: str = ""
    content: str = ""
    source: str = "failure"  # failure | success
    support: int = 0  # number of trajectories behind it


class ApplyEntry(Frozen):
    index: int
    op: str
    status: str  # applied | appended | unchanged | skipped_absent | skipped_empty_target | skipped_unknown_op


class ItemResult(Frozen):
    item_id: str
    task_type: str = ""
    hard: float
    soft: float
    fail_reason: str = ""
    prediction: str = ""
    trajectory: str | None = None  # blob hash of the conversation
    call: CallRef | None = None


class SplitScore(Frozen):
    hard: float
    soft: float
    n: int


class Scores(Frozen):
    hard: float
    soft: float
    gate: float  # the gate metric's value
    n: int
    by_task_type: dict[str, SplitScore] = Field(default_factory=dict)


class MergeCall(Frozen):
    level: int
    side: str  # failure | success | final
    inputs: int
    status: str  # ok | fallback
    call: CallRef | None = None


def usage_of(calls: list[CallRef | None]) -> dict[str, Usage]:
    """Usage per role of a list of calls."""
    out: dict[str, Usage] = {}
    for call in calls:
        if call is None:
            continue
        out[call.role] = out.get(call.role, Usage()) + Usage(
            calls=1, prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens
        )
    return out


class Event(Frozen):
    type: ClassVar[str]
    version: ClassVar[int] = 1

    def blob_refs(self) -> list[str]:
        """Hashes of the blobs this event references (checked by audit)."""
        return []

    def usage(self) -> dict[str, Usage]:
        return {}


# --- run lifecycle -------------------------------------------------------


class RunStarted(Event):
    type: ClassVar[str] = "RunStarted"
    config: dict[str, Any]
    initial_skill: str
    dataset: dict[str, dict[str, Any]]  # split -> {hash, count}
    dataset_fingerprint: str
    prompts: dict[str, str]  # prompt name -> blob hash
    steps_per_epoch: int
    total_steps: int
    package_version: str

    def blob_refs(self) -> list[str]:
        return [self.initial_skill, *(s["hash"] for s in self.dataset.values()), *self.prompts.values()]


class RunForked(Event):
    type: ClassVar[str] = "RunForked"
    parent_run_id: str
    fork_step: int
    parent_event_count: int  # events of the parent's lineage inherited
    parent_event_hash: str  # hash of the last inherited event
    overrides: dict[str, Any]
    config: dict[str, Any]
    prompts: dict[str, str]
    steps_per_epoch: int
    total_steps: int

    def blob_refs(self) -> list[str]:
        return list(self.prompts.values())


class BaselineEvaluated(Event):
    type: ClassVar[str] = "BaselineEvaluated"
    split: str
    skill: str
    scores: Scores
    results: str  # blob: JSON list of ItemResult
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)

    def blob_refs(self) -> list[str]:
        return [self.skill, self.results]

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role


class RunCompleted(Event):
    type: ClassVar[str] = "RunCompleted"
    steps: int
    best_step: int
    best_score: float
    current_score: float
    best_skill: str

    def blob_refs(self) -> list[str]:
        return [self.best_skill]


# --- one step ------------------------------------------------------------


class StepStarted(Event):
    type: ClassVar[str] = "StepStarted"
    step: int
    epoch: int
    batch_item_ids: list[str]
    edit_budget: int


class RolloutCompleted(Event):
    type: ClassVar[str] = "RolloutCompleted"
    step: int
    skill: str
    results: list[ItemResult]

    def blob_refs(self) -> list[str]:
        return [self.skill, *(r.trajectory for r in self.results if r.trajectory)]

    def usage(self) -> dict[str, Usage]:
        return usage_of([r.call for r in self.results])


class PatchProposed(Event):
    type: ClassVar[str] = "PatchProposed"
    step: int
    source: str  # failure | success
    minibatch: int
    item_ids: list[str]
    status: str  # ok | unparseable | error
    reasoning: str = ""
    failure_summary: list[str] = Field(default_factory=list)
    edits: list[Edit] = Field(default_factory=list)
    reply: str | None = None  # blob hash of the raw reply
    call: CallRef | None = None

    def blob_refs(self) -> list[str]:
        return [self.reply] if self.reply else []

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class PatchesMerged(Event):
    type: ClassVar[str] = "PatchesMerged"
    step: int
    failure_edits: list[Edit]
    success_edits: list[Edit]
    edits: list[Edit]
    merges: list[MergeCall] = Field(default_factory=list)

    def usage(self) -> dict[str, Usage]:
        return usage_of([m.call for m in self.merges])


class EditsSelected(Event):
    type: ClassVar[str] = "EditsSelected"
    step: int
    budget: int
    candidates: int
    method: str  # all | ranked | fallback
    selected_indices: list[int]
    edits: list[Edit]
    call: CallRef | None = None

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class CandidateBuilt(Event):
    type: ClassVar[str] = "CandidateBuilt"
    step: int
    base_skill: str
    skill: str
    report: list[ApplyEntry]
    changed: bool

    def blob_refs(self) -> list[str]:
        return [self.base_skill, self.skill]


class CandidateEvaluated(Event):
    type: ClassVar[str] = "CandidateEvaluated"
    step: int
    split: str
    skill: str
    scores: Scores
    cached: bool  # served from the selection-score cache
    results: str | None = None
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)

    def blob_refs(self) -> list[str]:
        return [self.skill] + ([self.results] if self.results else [])

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role


class GateDecided(Event):
    type: ClassVar[str] = "GateDecided"
    step: int
    decision: str  # accept_best | accept | reject | skip
    candidate_score: float | None
    current_score: float  # before the decision
    best_score: float  # before the decision
    reason: str = ""


class TestEvaluated(Event):
    type: ClassVar[str] = "TestEvaluated"
    __test__ = False  # not a pytest class
    label: str  # baseline | best
    split: str
    skill: str
    scores: Scores
    results: str
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)

    def blob_refs(self) -> list[str]:
        return [self.skill, self.results]

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        RunStarted, RunForked, BaselineEvaluated, RunCompleted, StepStarted, RolloutCompleted,
        PatchProposed, PatchesMerged, EditsSelected, CandidateBuilt, CandidateEvaluated,
        GateDecided, TestEvaluated,
    )
}

# (type, stored version) -> function turning that version's payload into the
# next version's. Register one per schema change; never edit stored rows.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class UnknownEventError(CorruptLogError, ValueError):
    """An event type or version this skillstate cannot read."""


def register(cls: type[Event]) -> type[Event]:
    """Register an event class (used by extensions and tests)."""
    EVENT_TYPES[cls.type] = cls
    return cls


def decode(type_name: str, version: int, payload: dict[str, Any]) -> Event:
    """Build the current version of an event from a stored payload."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise UnknownEventError(f"unknown event type {type_name!r}")
    if version > cls.version:
        raise UnknownEventError(f"{type_name} v{version} is newer than this skillstate (v{cls.version})")
    while version < cls.version:
        upcast = UPCASTERS.get((type_name, version))
        if upcast is None:
            raise UnknownEventError(f"no upcaster for {type_name} v{version}")
        payload = upcast(payload)
        version += 1
    return cls.model_validate(payload)


def encode(event: Event) -> dict[str, Any]:
    return event.model_dump(mode="json")
