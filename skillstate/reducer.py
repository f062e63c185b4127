"""The reducer: a pure fold of events into the state of a run.

`reduce(state, event)` never mutates its inputs and never does I/O. The
engine gets its own state by folding its own log, replay folds a prefix of
it, and audit checks that the whole log folds without error.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Iterable, Mapping

from skillstate import gate as gate_rules
from skillstate.errors import CorruptLogError
from skillstate.events import (
    BaselineEvaluated, CandidateBuilt, CandidateEvaluated, EditsSelected, Event, GateDecided, PatchesMerged,
    PatchProposed, RolloutCompleted, RunCompleted, RunForked, RunStarted, Scores, StepStarted, TestEvaluated, Usage,
)

EMPTY: Mapping = MappingProxyType({})

# Which stage an event's LLM usage is booked to.
STAGE_OF = {
    "BaselineEvaluated": "baseline",
    "RolloutCompleted": "rollout",
    "PatchProposed": "reflect",
    "PatchesMerged": "aggregate",
    "EditsSelected": "select",
    "CandidateEvaluated": "gate",
    "TestEvaluated": "test",
}


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
    rollout: RolloutCompleted | None = None
    patches: tuple[PatchProposed, ...] = ()
    merged: PatchesMerged | None = None
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
    current_score: float
    best_score: float
    current_skill: str
    best_skill: str
    reason: str = ""


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
    usage: Mapping[str, Usage] = field(default_factory=lambda: EMPTY)  # role -> usage
    usage_by_stage: Mapping[str, Mapping[str, Usage]] = field(default_factory=lambda: EMPTY)  # stage -> role -> usage
    tests: Mapping[str, TestEvaluated] = field(default_factory=lambda: EMPTY)  # label -> event
    completed: bool = False

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


def _with(mapping: Mapping, key, value) -> Mapping:
    new = dict(mapping)
    new[key] = value
    return MappingProxyType(new)


def _add_usage(state: RunState, event: Event) -> RunState:
    usage = event.usage()
    if not usage:
        return state
    total = dict(state.usage)
    stage_name = STAGE_OF.get(event.type, event.type)
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
    return gate_rules.gate_score(scores.hard, scores.soft, config["gate_metric"], config["gate_mixed_weight"])


def reduce(state: RunState, event: Event) -> RunState:
    """Fold one event into the state."""
    state = _add_usage(state, event)

    if isinstance(event, RunStarted):
        if state.started:
            raise FoldError("RunStarted after the run had started")
        return replace(state, config=MappingProxyType(event.config), prompts=MappingProxyType(event.prompts),
                       dataset=MappingProxyType(event.dataset), initial_skill=event.initial_skill,
                       steps_per_epoch=event.steps_per_epoch, total_steps=event.total_steps,
                       current_skill=event.initial_skill, best_skill=event.initial_skill)

    if not state.started:
        raise FoldError(f"{event.type} before the run started")

    if isinstance(event, RunForked):
        if state.progress is not None:
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
        return replace(state, baseline=event.scores, current_score=event.scores.gate, best_score=event.scores.gate,
                       best_step=0, score_cache=_with(state.score_cache, cache_key(event.split, event.skill), event.scores))

    if isinstance(event, StepStarted):
        if state.baseline is None or state.progress is not None or event.step != state.last_completed_step + 1:
            raise FoldError(f"StepStarted {event.step} out of order")
        return replace(state, step=event.step, epoch=event.epoch, edit_budget=event.edit_budget,
                       progress=StepProgress(step=event.step, epoch=event.epoch,
                                             batch_item_ids=tuple(event.batch_item_ids),
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

    if isinstance(event, EditsSelected):
        p = _progress(state, event)
        return replace(state, progress=replace(p, selected=event))

    if isinstance(event, CandidateBuilt):
        p = _progress(state, event)
        return replace(state, progress=replace(p, candidate=event))

    if isinstance(event, CandidateEvaluated):
        p = _progress(state, event)
        return replace(state, progress=replace(p, evaluation=event),
                       score_cache=_with(state.score_cache, cache_key(event.split, event.skill), event.scores))

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
                            reason=event.reason)
        return replace(state, progress=None, history=state.history + (record,),
                       current_skill=current_skill, current_score=current_score,
                       best_skill=best_skill, best_score=best_score, best_step=best_step)

    if isinstance(event, TestEvaluated):
        return replace(state, tests=_with(state.tests, event.label, event))

    if isinstance(event, RunCompleted):
        if state.progress is not None:
            raise FoldError("RunCompleted in the middle of a step")
        return replace(state, completed=True)

    raise FoldError(f"the reducer does not know {event.type}")


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
