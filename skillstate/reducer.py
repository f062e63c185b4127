"""The reducer: a pure fold of events into the state of a run.

`reduce(state, event)` never mutates its inputs and never does I/O. The
engine gets its own state by folding its own log, replay folds a prefix of
it, and audit checks that the whole log folds without error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypeVar

from skillstate import gate as gate_rules
from skillstate.errors import CorruptLogError, InternalError
from skillstate.events import (
    BaselineEvaluated,
    CandidateBuilt,
    CandidateEvaluated,
    Edit,
    EditsSelected,
    EpochCompared,
    EpochEnded,
    Event,
    FinalValidated,
    GateDecided,
    LearningRateChosen,
    MetaSkillWritten,
    PatchesMerged,
    PatchProposed,
    RolloutCompleted,
    RunCompleted,
    RunForked,
    RunStarted,
    Scores,
    SlowUpdateDecided,
    SlowUpdateProposed,
    StepStarted,
    TestEvaluated,
    Usage,
)

EMPTY: Mapping = MappingProxyType({})

T = TypeVar("T")

# Events the epoch-boundary fold (`_reduce_epoch_end`) handles.
EpochEndEvent = EpochCompared | SlowUpdateProposed | SlowUpdateDecided | MetaSkillWritten | EpochEnded | FinalValidated

# Which stage an event's LLM usage is booked to.
STAGE_OF = {
    "BaselineEvaluated": "baseline",
    "RolloutCompleted": "rollout",
    "PatchProposed": "reflect",
    "PatchesMerged": "aggregate",
    "LearningRateChosen": "select",
    "EditsSelected": "select",
    "CandidateBuilt": "update",
    "CandidateEvaluated": "gate",
    "EpochCompared": "slow_update",
    "SlowUpdateProposed": "slow_update",
    "SlowUpdateDecided": "slow_update",
    "MetaSkillWritten": "meta_skill",
    "TestEvaluated": "test",
}


def stage_of(event: Event) -> str:
    """The stage an event's LLM calls are booked to."""
    return "eval" if getattr(event, "label", None) == "eval" else STAGE_OF.get(event.type, event.type)


class FoldError(CorruptLogError, ValueError):
    """An event that cannot follow the events before it."""


@dataclass(frozen=True)
class StepProgress:
    """What has happened so far in the step under way."""

    step: int
    epoch: int
    batch_item_ids: tuple[str, ...]
    edit_budget: int
    base_skill: str
    sub_batches: tuple[tuple[str, ...], ...] = ()
    rollout: RolloutCompleted | None = None
    patches: tuple[PatchProposed, ...] = ()
    merged: PatchesMerged | None = None
    learning_rate: LearningRateChosen | None = None
    selected: EditsSelected | None = None
    candidate: CandidateBuilt | None = None
    evaluation: CandidateEvaluated | None = None


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
            out["rejected_edits"] = [{"op": e.op, "target": e.target, "content": e.content}
                                     for e in self.rejected_edits]
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


def _with(mapping: Mapping, key, value) -> Mapping:
    new = dict(mapping)
    new[key] = value
    return MappingProxyType(new)


def _add_usage(state: RunState, event: Event) -> RunState:
    usage = event.usage()
    if not usage:
        return state
    total = dict(state.usage)
    stage_name = stage_of(event)
    stage = dict(state.usage_by_stage.get(stage_name, EMPTY))
    for role, u in usage.items():
        total[role] = total.get(role, Usage()) + u
        stage[role] = stage.get(role, Usage()) + u
    return replace(state, usage=MappingProxyType(total),
                   usage_by_stage=_with(state.usage_by_stage, stage_name, MappingProxyType(stage)))


def _progress(state: RunState, event: Event) -> StepProgress:
    p = state.progress
    step = getattr(event, "step", None)
    if p is None or step != p.step:
        raise FoldError(f"{event.type} for step {step} outside step {p.step if p else 'none'}")
    return p


def _regate(scores: Scores, config: Mapping) -> float:
    base = gate_rules.gate_score(scores.hard, scores.soft, config["gate_metric"], config["gate_mixed_weight"])
    return gate_rules.with_density(base, scores.density, config.get("semantic_density_weight", 0.0))


def _buffer_entry(p: StepProgress, event: GateDecided) -> BufferEntry:
    results = p.rollout.results if p.rollout else []
    failed = [r for r in results if r.hard < 1]
    by_type: dict[str, int] = {}
    for r in failed:
        by_type[r.task_type or "untyped"] = by_type.get(r.task_type or "untyped", 0) + 1
    patterns: list[str] = []
    for patch in p.patches:
        for line in patch.failure_summary:
            if line not in patterns:
                patterns.append(line)
    selected = p.selected if event.decision == gate_rules.REJECT else None
    rejected = selected is not None
    return BufferEntry(step=event.step, decision=event.decision, items=len(results), failures=len(failed),
                       failures_by_task_type=MappingProxyType(dict(sorted(by_type.items()))),
                       patterns=tuple(patterns[:12]),
                       rejected_edits=tuple(selected.edits) if selected is not None else (),
                       score_before=event.current_score if rejected else None,
                       score_after=event.candidate_score if rejected else None,
                       after_is_bound=rejected and p.evaluation is not None and p.evaluation.partial is not None)


def reduce(state: RunState, event: Event) -> RunState:
    """Fold one event into the state."""
    state = _add_usage(state, event)

    if isinstance(event, RunStarted):
        if state.started:
            raise FoldError("RunStarted after the run had started")
        return replace(state, config=MappingProxyType(event.config), prompts=MappingProxyType(event.prompts),
                       dataset=MappingProxyType(event.dataset), initial_skill=event.initial_skill,
                       steps_per_epoch=event.steps_per_epoch, total_steps=event.total_steps,
                       current_skill=event.initial_skill, best_skill=event.initial_skill,
                       kind=event.kind, eval_split=event.eval_split)

    if not state.started:
        raise FoldError(f"{event.type} before the run started")

    if isinstance(event, RunForked):
        if state.progress is not None or state.boundary is not None:
            raise FoldError("RunForked in the middle of a step")
        new = replace(state, config=MappingProxyType(event.config), prompts=MappingProxyType(event.prompts),
                      parent_run_id=event.parent_run_id, fork_step=event.fork_step,
                      steps_per_epoch=event.steps_per_epoch, total_steps=event.total_steps,
                      tests=EMPTY, completed=False)
        # A fork may change the gate metric: rescore current and best from the cache.
        split = event.config["val_split"]
        cur = state.score_cache.get(cache_key(split, state.current_skill or ""))
        best = state.score_cache.get(cache_key(split, state.best_skill or ""))
        if cur is not None and best is not None:
            new = replace(new, current_score=_regate(cur, event.config), best_score=_regate(best, event.config))
        return new

    if isinstance(event, BaselineEvaluated):
        if state.baseline is not None:
            raise FoldError("BaselineEvaluated twice")
        key = cache_key(event.split, event.skill)
        return replace(state, baseline=event.scores, current_score=event.scores.gate, best_score=event.scores.gate,
                       best_step=0, score_cache=_with(state.score_cache, key, event.scores),
                       results_cache=_with(state.results_cache, key, event.results))

    if isinstance(event, StepStarted):
        if (state.baseline is None or state.progress is not None or state.boundary is not None
                or event.step != state.last_completed_step + 1):
            raise FoldError(f"StepStarted {event.step} out of order")
        new_epoch = event.epoch != state.epoch
        epoch_skills = state.epoch_skills
        if event.epoch not in epoch_skills:
            epoch_skills = _with(epoch_skills, event.epoch, state.current_skill or "")
        return replace(state, step=event.step, epoch=event.epoch, edit_budget=event.edit_budget,
                       buffer=() if new_epoch else state.buffer, epoch_skills=epoch_skills,
                       progress=StepProgress(step=event.step, epoch=event.epoch,
                                             batch_item_ids=tuple(event.batch_item_ids),
                                             sub_batches=tuple(tuple(b) for b in event.sub_batches),
                                             edit_budget=event.edit_budget, base_skill=state.current_skill or ""))

    if isinstance(event, RolloutCompleted):
        p = _progress(state, event)
        return replace(state, progress=replace(p, rollout=event))

    if isinstance(event, PatchProposed):
        p = _progress(state, event)
        if p.rollout is None:
            raise FoldError("PatchProposed before RolloutCompleted")
        return replace(state, progress=replace(p, patches=p.patches + (event,)))

    if isinstance(event, PatchesMerged):
        p = _progress(state, event)
        return replace(state, progress=replace(p, merged=event))

    if isinstance(event, LearningRateChosen):
        p = _progress(state, event)
        return replace(state, progress=replace(p, learning_rate=event))

    if isinstance(event, EditsSelected):
        p = _progress(state, event)
        return replace(state, progress=replace(p, selected=event))

    if isinstance(event, CandidateBuilt):
        p = _progress(state, event)
        return replace(state, progress=replace(p, candidate=event))

    if isinstance(event, CandidateEvaluated):
        p = _progress(state, event)
        new = replace(state, progress=replace(p, evaluation=event))
        if event.partial is not None:  # an early reject's scores cover some items only: never cached
            return new
        key = cache_key(event.split, event.skill)
        new = replace(new, score_cache=_with(state.score_cache, key, event.scores))
        return replace(new, results_cache=_with(state.results_cache, key, event.results)) if event.results else new

    if isinstance(event, GateDecided):
        p = _progress(state, event)
        current_skill, current_score = state.current_skill, state.current_score
        best_skill, best_score, best_step = state.best_skill, state.best_score, state.best_step
        if event.decision in gate_rules.ACCEPTED:
            if p.candidate is None or event.candidate_score is None:
                raise FoldError("GateDecided accepts a step without a candidate")
            current_skill, current_score = p.candidate.skill, event.candidate_score
            if event.decision == gate_rules.ACCEPT_BEST:
                best_skill, best_score, best_step = p.candidate.skill, event.candidate_score, event.step
        record = StepRecord(step=event.step, epoch=p.epoch, edit_budget=p.edit_budget, decision=event.decision,
                            candidate_score=event.candidate_score, current_score=current_score,
                            best_score=best_score, current_skill=current_skill, best_skill=best_skill,
                            reason=event.reason, forced=event.forced)
        return replace(state, progress=None, history=state.history + (record,),
                       buffer=state.buffer + (_buffer_entry(p, event),),
                       current_skill=current_skill, current_score=current_score,
                       best_skill=best_skill, best_score=best_score, best_step=best_step)

    if isinstance(event, TestEvaluated):
        new = replace(state, tests=_with(state.tests, event.label, event))
        if event.label == "eval":  # an evaluation run's one score
            new = replace(new, current_score=event.scores.gate, best_score=event.scores.gate)
        return new

    if isinstance(event, (EpochCompared, SlowUpdateProposed, SlowUpdateDecided, MetaSkillWritten, EpochEnded,
                          FinalValidated)):
        return _reduce_epoch_end(state, event)

    if isinstance(event, RunCompleted):
        if state.progress is not None or state.boundary is not None:
            raise FoldError("RunCompleted in the middle of a step")
        return replace(state, completed=True)

    raise FoldError(f"the reducer does not know {event.type}")


def _reduce_epoch_end(state: RunState, event: EpochEndEvent) -> RunState:
    if state.progress is not None:
        raise FoldError(f"{event.type} in the middle of step {state.progress.step}")
    if isinstance(event, FinalValidated):
        if state.boundary is not None:
            raise FoldError("FinalValidated during epoch-boundary work")
        if not event.promoted:
            return replace(state, final_validated=True)
        return replace(state, final_validated=True, best_skill=event.skill, best_score=event.score,
                       best_step=state.last_completed_step)
    b = state.boundary
    if isinstance(event, EpochCompared):
        if b is not None or event.epoch <= state.closed_epoch:
            raise FoldError(f"EpochCompared for epoch {event.epoch} out of order")
        return replace(state, boundary=BoundaryProgress(epoch=event.epoch, comparison=event))
    if b is None or b.epoch != event.epoch:
        raise FoldError(f"{event.type} for epoch {event.epoch} outside its epoch boundary")
    if isinstance(event, SlowUpdateProposed):
        return replace(state, boundary=replace(b, slow_update=event))
    if isinstance(event, SlowUpdateDecided):
        new = replace(state, boundary=replace(b, slow_decision=event))
        if event.scores is not None and b.slow_update is not None and b.slow_update.skill:
            key = cache_key(state.config["val_split"], b.slow_update.skill)
            new = replace(new, score_cache=_with(state.score_cache, key, event.scores))
        if event.decision not in gate_rules.ACCEPTED:
            return new
        if b.slow_update is None or not b.slow_update.skill or event.candidate_score is None:
            raise FoldError("SlowUpdateDecided accepts without a candidate")
        new = replace(new, current_skill=b.slow_update.skill, current_score=event.candidate_score,
                      guidance=b.slow_update.guidance)
        if event.decision == gate_rules.ACCEPT_BEST:
            new = replace(new, best_skill=b.slow_update.skill, best_score=event.candidate_score,
                          best_step=state.last_completed_step)
        return new
    if isinstance(event, MetaSkillWritten):
        new = replace(state, boundary=replace(b, meta=event))
        return replace(new, memo=event.memo, memo_epoch=event.epoch) if event.status == "ok" else new
    return replace(state, boundary=None, closed_epoch=event.epoch)  # EpochEnded


def usage_totals(events: Iterable[Event]) -> RunState:
    """A state holding only the usage of `events` (per role and per stage)."""
    state = RunState()
    for event in events:
        state = _add_usage(state, event)
    return state


def fold(events: Iterable[Event], state: RunState | None = None) -> RunState:
    state = state or RunState()
    for event in events:
        state = reduce(state, event)
    return state
