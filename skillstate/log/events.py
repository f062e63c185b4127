"""The immutable events of a run.

Every stage of the engine emits events; they are the only truth about a run.
Each event class has a `type` name and a schema `version`. Stored rows are
never rewritten: an event stored under an older version is upcast on read
(`skillstate.log.event_codec`, which also holds the registry of types by name).

Large texts (skills, trajectories, prompts, raw replies) are not stored in
events: events hold the sha256 of a row in the blob table.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from skillstate.log.values import (  # noqa: F401  (re-exported: events are built from these)
    ApplyEntry,
    CallRef,
    DroppedEdit,
    Edit,
    Frozen,
    ItemResult,
    MergeCall,
    PairedTest,
    PartialEval,
    RetrievedSkill,
    Scores,
    SplitScore,
    TypeGuard,
    Usage,
    usage_of,
)


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
    version: ClassVar[int] = 16
    config: dict[str, Any]
    initial_skill: str
    dataset: dict[str, dict[str, Any]]  # split -> {hash, count}
    dataset_fingerprint: str
    prompts: dict[str, str]  # prompt name -> blob hash
    steps_per_epoch: int
    total_steps: int
    package_version: str
    kind: str = "train"  # train | eval (scores one skill, no steps)
    eval_split: str | None = None
    trajectories: str | None = None  # mode bank: the imported trajectories (bank.trajectories), as a blob
    # an Agent Skills directory or archive as initial_skill: the tree it was read from (its blob, from
    # skilltree.encode_tree) and the blobs of its files; the run trains its SKILL.md (`initial_skill`).
    # Both are left out of the stored payload when there is none, so a markdown skill's event reads as before.
    skill_tree: str | None = None
    skill_tree_blobs: list[str] = []
    # disclosure tools: the tree blobs of the distractor skills installed beside the trained one (their files'
    # blobs are in skill_tree_blobs); left out when there are none.
    distractors: list[str] = []

    @model_serializer(mode="wrap")
    def _without_tree_when_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if data.get("skill_tree") is None:
            data.pop("skill_tree", None)
            data.pop("skill_tree_blobs", None)
        if not data.get("distractors"):
            data.pop("distractors", None)
        return data

    def blob_refs(self) -> list[str]:
        return [self.initial_skill, *(s["hash"] for s in self.dataset.values()), *self.prompts.values(),
                *([self.trajectories] if self.trajectories else []),
                *([self.skill_tree, *self.skill_tree_blobs] if self.skill_tree else []), *self.distractors]


class RunForked(Event):
    type: ClassVar[str] = "RunForked"
    version: ClassVar[int] = 14
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
    sub_batches: list[list[str]] = Field(default_factory=list)  # accumulation > 1: the k sub-batches


class RolloutCompleted(Event):
    type: ClassVar[str] = "RolloutCompleted"
    step: int
    skill: str
    results: list[ItemResult]

    def blob_refs(self) -> list[str]:
        return [self.skill, *(r.trajectory for r in self.results if r.trajectory)]

    def usage(self) -> dict[str, Usage]:
        return usage_of([c for r in self.results for c in r.all_calls()])


class PatchProposed(Event):
    type: ClassVar[str] = "PatchProposed"
    step: int
    source: str  # failure | success
    minibatch: int
    item_ids: list[str]
    status: str  # ok | unparseable | error
    reasoning: str = ""
    failure_summary: list[str] = Field(default_factory=list)
    edits: list[Edit] = Field(default_factory=list)  # update_mode rewrite: op "suggest"
    reply: str | None = None  # blob hash of the raw reply
    call: CallRef | None = None
    sub_batch: int = 0  # accumulation: which sub-batch the minibatch came from
    skill: str | None = None  # update_mode full_rewrite: blob of the whole skill the analyst wrote

    def blob_refs(self) -> list[str]:
        return [h for h in (self.reply, self.skill) if h]

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class PatchesMerged(Event):
    type: ClassVar[str] = "PatchesMerged"
    step: int
    failure_edits: list[Edit]
    success_edits: list[Edit]
    edits: list[Edit]
    merges: list[MergeCall] = Field(default_factory=list)
    skill: str | None = None  # update_mode full_rewrite: blob of the merged whole skill

    def blob_refs(self) -> list[str]:
        return [self.skill] if self.skill else []

    def usage(self) -> dict[str, Usage]:
        return usage_of([m.call for m in self.merges])


class LearningRateChosen(Event):
    """lr_control autonomous: how many of the merged edits the optimizer applies."""

    type: ClassVar[str] = "LearningRateChosen"
    step: int
    candidates: int
    status: str  # ok | unparseable | error
    requested: str | None = None  # the raw value the reply gave, as JSON text
    chosen: int  # clamped to [0, candidates]; 0 when the reply is unusable
    reasoning: str = ""
    call: CallRef | None = None

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class EditsSelected(Event):
    type: ClassVar[str] = "EditsSelected"
    step: int
    budget: int
    candidates: int
    method: str  # all | ranked | fallback | none
    selected_indices: list[int]
    edits: list[Edit]
    call: CallRef | None = None
    dropped: list[DroppedEdit] = []  # edits that would change nothing, left out before selection
    # a run that trains a directory: edits that create a file a selected edit links to, kept with it
    # (skillopt.linked_pairs); left out of the payload when there are none, so older events read as before
    paired: list[int] = []

    @model_serializer(mode="wrap")
    def _without_pairs_when_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        if not data.get("paired"):
            data.pop("paired", None)
        return data

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class CandidateBuilt(Event):
    type: ClassVar[str] = "CandidateBuilt"
    step: int
    base_skill: str
    skill: str
    report: list[ApplyEntry]
    changed: bool
    method: str = "patch"  # patch | rewrite | full_rewrite
    status: str = "ok"  # rewrite: ok | unparseable | error (then the skill is unchanged)
    block_restored: bool = False  # the slow-update block had to be put back
    call: CallRef | None = None

    def blob_refs(self) -> list[str]:
        return [self.base_skill, self.skill]

    def usage(self) -> dict[str, Usage]:
        return usage_of([self.call])


class CandidateEvaluated(Event):
    type: ClassVar[str] = "CandidateEvaluated"
    step: int
    split: str
    skill: str
    scores: Scores
    cached: bool  # served from the selection-score cache
    results: str | None = None
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)
    partial: PartialEval | None = None  # early reject: `scores` cover only the items scored

    def blob_refs(self) -> list[str]:
        return [self.skill] + ([self.results] if self.results else [])

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role


class GateDecided(Event):
    type: ClassVar[str] = "GateDecided"
    version: ClassVar[int] = 2
    step: int
    decision: str  # accept_best | accept | reject | skip
    candidate_score: float | None
    current_score: float  # before the decision
    best_score: float  # before the decision
    reason: str = ""
    forced: bool = False  # use_gate false: accepted whatever the score
    # v2: the verdicts of the robust rules, when configured (gate_rule paired, gate_type_margin)
    rule: str = "strict"  # strict | paired
    paired: PairedTest | None = None
    type_guard: TypeGuard | None = None


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


class StopConditionMet(Event):
    """A stop condition held at an event boundary: the run stopped cleanly
    after `step` and resumes where it stopped once the condition is relaxed."""

    type: ClassVar[str] = "StopConditionMet"
    condition: str  # no_improvement | target_score | wall_time | stop_file
    reason: str
    step: int  # the last completed step
