"""The state a run's events fold into: the run (`RunState`), the step under
way (`StepProgress`), the epoch-boundary work (`BoundaryProgress`), each
finished step (`StepRecord`) and the step buffer's entries (`BufferEntry`),
with the accessors stages use. Frozen; `skillstate.log.reducer` builds them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from skillstate.errors import InternalError
from skillstate.log.events import (
    CandidateBuilt,
    CandidateEvaluated,
    Edit,
    EditsSelected,
    LearningRateChosen,
    PatchesMerged,
    PatchProposed,
    RolloutCompleted,
    Scores,
    StopConditionMet,
    TestEvaluated,
    Usage,
)
from skillstate.log.events_bank import BankEvolved, BankValidated, SkillsDistilled
from skillstate.log.events_blocker import BlockerSearched
from skillstate.log.events_check import CandidateChecked
from skillstate.log.events_epoch import EpochCompared, MetaSkillWritten, SlowUpdateDecided, SlowUpdateProposed
from skillstate.log.events_pareto import ParentChosen
from skillstate.log.events_policy import Checkpoint, PolicyBankEvolved, PolicyStarted, PolicyTrained, PolicyValidated
from skillstate.log.events_repair import EditsAblated
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.log.events_screen import EditsScreened
from skillstate.log.prune_events import PruneProposed
from skillstate.log.selection_events import FinalSelected, SelectionScored

EMPTY: Mapping = MappingProxyType({})

T = TypeVar("T")


@dataclass(frozen=True)
class StepProgress:
    """What has happened so far in the step under way."""

    step: int
    epoch: int
    batch_item_ids: tuple[str, ...]
    edit_budget: int
    base_skill: str
    sub_batches: tuple[tuple[str, ...], ...] = ()
    parent: ParentChosen | None = None  # parent_selection pareto: the draw (base_skill is its skill)
    rollout: RolloutCompleted | None = None
    patches: tuple[PatchProposed, ...] = ()
    merged: PatchesMerged | None = None
    learning_rate: LearningRateChosen | None = None
    screened: EditsScreened | None = None  # edit_screen minibatch: the merged edits tried before selection
    selected: EditsSelected | None = None
    candidate: CandidateBuilt | None = None
    checked: CandidateChecked | None = None  # minibatch_gate: the candidate on the step's batch
    evaluation: CandidateEvaluated | None = None
    repair: EditsAblated | None = None  # repair: ablate (the candidate after it, when repaired, is `candidate`)
    blocker: BlockerSearched | None = None  # blocker_search (the candidate after it, when found, is `candidate`)
    # mode bank: the step's distillation, validation and evolution
    distilled: SkillsDistilled | None = None
    validated: BankValidated | None = None
    evolved: BankEvolved | None = None
    # review: the step put before a person (after the gate decided) and their decision
    review: ReviewRequested | None = None
    review_decision: ReviewDecided | None = None
    review_rebuilt: bool = False  # ... which dropped edits: the candidate is now the one rebuilt without them


@dataclass(frozen=True)
class PolicyProgress:
    """A policy training run (kind policy) so far."""

    started: PolicyStarted
    step: int = 0  # the optimizer steps trained, as of the last checkpoint
    checkpoint: Checkpoint | None = None
    trained: tuple[PolicyTrained, ...] = ()
    validated: tuple[PolicyValidated, ...] = ()
    evolved: tuple[PolicyBankEvolved, ...] = ()


@dataclass(frozen=True)
class StepRecord:
    """A finished step, as history."""

    step: int
    epoch: int
    edit_budget: int
    decision: str
    candidate_score: float | None
    # After the step, as RunState holds them: Optional like there (set from the
    # baseline and RunStarted on; the fold does not require it of every log).
    current_score: float | None
    best_score: float | None
    current_skill: str | None
    best_skill: str | None
    reason: str = ""
    forced: bool = False


@dataclass(frozen=True)
class BufferEntry:
    """One earlier step of the epoch, as the step buffer shows it."""

    step: int
    decision: str
    items: int
    failures: int
    failures_by_task_type: Mapping[str, int]
    patterns: tuple[str, ...]  # the analysts' failure summaries
    rejected_edits: tuple[Edit, ...] = ()  # on reject: the edits that were tried
    score_before: float | None = None
    score_after: float | None = None
    after_is_bound: bool = False  # rejected early: score_after is the bound that proved the reject

    def to_json(self) -> dict:
        out = {"step": self.step, "action": self.decision, "items": self.items, "failures": self.failures,
               "failures_by_task_type": dict(self.failures_by_task_type), "failure_patterns": list(self.patterns)}
        if self.rejected_edits:
            out["rejected_edits"] = [{"op": e.op, "target": e.target, "content": e.content,
                                      **({"file": e.file} if e.file else {})} for e in self.rejected_edits]
            out["score_before"] = self.score_before
            out["score_after_at_most" if self.after_is_bound else "score_after"] = self.score_after
        return out


@dataclass(frozen=True)
class BoundaryProgress:
    """The epoch-boundary work under way (slow update, meta skill)."""

    epoch: int
    comparison: EpochCompared
    slow_update: SlowUpdateProposed | None = None
    slow_decision: SlowUpdateDecided | None = None
    meta: MetaSkillWritten | None = None


@dataclass(frozen=True)
class RunState:
    config: Mapping = field(default_factory=lambda: EMPTY)
    prompts: Mapping = field(default_factory=lambda: EMPTY)
    dataset: Mapping = field(default_factory=lambda: EMPTY)
    initial_skill: str | None = None
    skill_tree: str | None = None  # the Agent Skills tree initial_skill's SKILL.md came from (RunStarted)
    distractors: tuple[str, ...] = ()  # disclosure tools: the trees of the skills installed beside it
    parent_run_id: str | None = None
    fork_step: int | None = None
    steps_per_epoch: int = 0
    total_steps: int = 0
    baseline: Scores | None = None
    current_skill: str | None = None
    current_score: float | None = None
    best_skill: str | None = None
    best_score: float | None = None
    best_step: int = 0
    step: int = 0  # last step started (0 = none)
    epoch: int = 0
    edit_budget: int = 0  # scheduler position: budget of the last step started
    progress: StepProgress | None = None
    history: tuple[StepRecord, ...] = ()
    score_cache: Mapping[str, Scores] = field(default_factory=lambda: EMPTY)  # "split:skill hash" -> scores
    results_cache: Mapping[str, str] = field(default_factory=lambda: EMPTY)  # "split:skill hash" -> results blob
    # the same for a scored slow update (kept apart: results_cache orders early-reject evaluations, as logged)
    slow_results: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    usage: Mapping[str, Usage] = field(default_factory=lambda: EMPTY)  # role -> usage
    usage_by_stage: Mapping[str, Mapping[str, Usage]] = field(default_factory=lambda: EMPTY)  # stage -> role -> usage
    tests: Mapping[str, TestEvaluated] = field(default_factory=lambda: EMPTY)  # label -> event
    completed: bool = False
    kind: str = "train"  # train | eval
    eval_split: str | None = None
    buffer: tuple[BufferEntry, ...] = ()  # the step buffer of the current epoch
    epoch_skills: Mapping[int, str] = field(default_factory=lambda: EMPTY)  # epoch -> skill it started from
    boundary: BoundaryProgress | None = None
    closed_epoch: int = 0  # last epoch whose boundary work is done
    guidance: str | None = None  # the slow-update guidance in the current skill
    memo: str | None = None  # the meta skill: memo to the optimizer
    memo_epoch: int = 0
    final_validated: bool = False
    stopped: StopConditionMet | None = None  # the log ends with this stop (cleared by any later event)
    trajectories: str | None = None  # mode bank: the imported trajectories' blob
    seeded: bool = False  # mode bank: the imported trajectories were distilled (BankSeeded)
    start_skill: str | None = None  # what the baseline scores and step 1 starts from: the initial skill or seeded bank
    bank_checked: str | None = None  # mode bank: the bank last scored on val and kept (distillation rolls back to it)
    policy: PolicyProgress | None = None  # kind policy: the training so far
    prune: PruneProposed | None = None  # prune: the proposal awaiting its decision
    pruned_step: int = 0  # prune: the last step after which the prune was decided
    prune_rejected: tuple[tuple[str, str], ...] = ()  # prune: (skill, line) of each deletion the gate turned down
    selection_scored: tuple[SelectionScored, ...] = ()  # final_selection: the candidates re-scored so far
    final_selection: FinalSelected | None = None  # final_selection: the pick (the best skill since)
    # drop_rejected_edits: (op, target, content) -> rejected candidates the edit was in, plus the repair's drops
    rejected_edits: Mapping[tuple[str, str, str], int] = field(default_factory=lambda: EMPTY)

    @property
    def started(self) -> bool:
        return bool(self.config)

    @property
    def last_completed_step(self) -> int:
        return self.history[-1].step if self.history else 0

    def count(self, *decisions: str) -> int:
        return sum(1 for rec in self.history if rec.decision in decisions)

    def record(self, step: int) -> StepRecord | None:
        for rec in self.history:
            if rec.step == step:
                return rec
        return None


def cache_key(split: str, skill: str) -> str:
    return f"{split}:{skill}"


def need(value: T | None, what: str) -> T:
    """`value`, which the caller knows is set: a stage reads only what the
    events `next_stage` ordered before it put in the state, and a started
    run has its skills (and, from the baseline on, its scores). The narrowing
    for the state's Optional fields; None here is a bug, not a bad log."""
    if value is None:
        raise InternalError(f"{what} is not in the folded state yet")
    return value


def step_progress(state: RunState) -> StepProgress:
    """The progress of the step under way (for the stages inside a step)."""
    return need(state.progress, "the progress of a step")


def boundary_progress(state: RunState) -> BoundaryProgress:
    """The epoch-boundary work under way (for the boundary stages)."""
    return need(state.boundary, "the epoch-boundary progress")
