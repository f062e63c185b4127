"""The reducer: a pure fold of events into the state of a run.

`reduce(state, event)` never mutates its inputs and never does I/O. The
engine gets its own state by folding its own log, replay folds a prefix of
it, and audit checks that the whole log folds without error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from skillstate.errors import CorruptLogError
from skillstate.log import selection_fold
from skillstate.log.events import (
    BaselineEvaluated,
    CandidateBuilt,
    CandidateEvaluated,
    Edit,
    EditsSelected,
    Event,
    GateDecided,
    LearningRateChosen,
    PatchesMerged,
    PatchProposed,
    RolloutCompleted,
    RunCompleted,
    RunForked,
    RunStarted,
    Scores,
    StepStarted,
    StopConditionMet,
    TestEvaluated,
    Usage,
)
from skillstate.log.events_bank import BankEvolved, BankSeeded, BankValidated, SkillsDistilled
from skillstate.log.events_blocker import BlockerSearched
from skillstate.log.events_check import CandidateChecked
from skillstate.log.events_epoch import (
    EpochCompared,
    EpochEnded,
    FinalValidated,
    MetaSkillWritten,
    SlowUpdateDecided,
    SlowUpdateProposed,
)
from skillstate.log.events_pareto import ParentChosen
from skillstate.log.events_policy import PolicyBankEvolved, PolicyStarted, PolicyTrained, PolicyValidated
from skillstate.log.events_repair import EditsAblated
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.log.events_screen import EditsScreened
from skillstate.log.policy_fold import reduce_policy
from skillstate.log.prune_events import PruneDecided, PruneProposed
from skillstate.log.prune_fold import fold_prune
from skillstate.log.review_fold import check_gate, fold_rebuilt, fold_review, reviewed
from skillstate.log.selection_events import FinalSelected, SelectionScored
from skillstate.log.state import (  # noqa: F401  (re-exported: the state's shapes and accessors)
    EMPTY,
    BoundaryProgress,
    BufferEntry,
    RunState,
    StepProgress,
    StepRecord,
    boundary_progress,
    cache_key,
    need,
    step_progress,
)
from skillstate.skillopt import gate as gate_rules

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
    "EditsAblated": "repair",
    "BlockerSearched": "blocker",
    "EditsScreened": "screen",
    "CandidateChecked": "check",
    "SkillsDistilled": "distill",
    "BankValidated": "validate",
    "BankEvolved": "evolve",
    "BankSeeded": "distill",
    "PolicyBankEvolved": "evolve",
    "EpochCompared": "slow_update",
    "SlowUpdateProposed": "slow_update",
    "SlowUpdateDecided": "slow_update",
    "MetaSkillWritten": "meta_skill",
    "TestEvaluated": "test",
    "PruneProposed": "prune",
    "PruneDecided": "prune",
    "SelectionScored": "final_select",
}


def stage_of(event: Event) -> str:
    """The stage an event's LLM calls are booked to."""
    return "eval" if getattr(event, "label", None) == "eval" else STAGE_OF.get(event.type, event.type)


class FoldError(CorruptLogError, ValueError):
    """An event that cannot follow the events before it."""


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
    return gate_rules.gate_of(scores, config["gate_metric"], config["gate_mixed_weight"],
                              config.get("semantic_density_weight", 0.0))


def _count_edits(counts: Mapping[tuple[str, str, str], int], edits: Iterable[Edit]) -> Mapping:
    """`counts` with each of `edits` counted once more (an edit listed twice counts once)."""
    keys = {(e.keyed_op, e.target, e.content) for e in edits}
    if not keys:
        return counts
    return MappingProxyType({**counts, **{k: counts.get(k, 0) + 1 for k in keys}})


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
                       kind=event.kind, eval_split=event.eval_split, trajectories=event.trajectories,
                       start_skill=event.initial_skill, skill_tree=event.skill_tree,
                       distractors=tuple(event.distractors))

    if not state.started:
        raise FoldError(f"{event.type} before the run started")
    if isinstance(event, StopConditionMet):
        return replace(state, stopped=event)
    if state.stopped is not None:
        state = replace(state, stopped=None)

    if isinstance(event, RunForked):
        if state.progress is not None or state.boundary is not None or state.prune is not None:
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

    if isinstance(event, BankSeeded):
        if state.baseline is not None or state.seeded:
            raise FoldError("BankSeeded after the baseline, or twice")
        return replace(state, seeded=True, current_skill=event.skill, best_skill=event.skill, start_skill=event.skill)

    if isinstance(event, BaselineEvaluated):
        if state.baseline is not None:
            raise FoldError("BaselineEvaluated twice")
        key = cache_key(event.split, event.skill)
        return replace(state, baseline=event.scores, current_score=event.scores.gate, best_score=event.scores.gate,
                       best_step=0, bank_checked=event.skill, score_cache=_with(state.score_cache, key, event.scores),
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

    if isinstance(event, ParentChosen):  # parent_selection pareto: the step builds on the drawn skill
        p = _progress(state, event)
        if p.rollout is not None or p.parent is not None:
            raise FoldError("ParentChosen after the step's rollout, or twice")
        epoch_skills = state.epoch_skills
        if not state.history or state.history[-1].epoch != p.epoch:  # the epoch's first step
            epoch_skills = _with(epoch_skills, p.epoch, event.skill)  # the epoch starts from the parent
        return replace(state, current_skill=event.skill, current_score=event.score, epoch_skills=epoch_skills,
                       progress=replace(p, parent=event, base_skill=event.skill))

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

    if isinstance(event, EditsScreened):
        p = _progress(state, event)
        if p.merged is None or p.screened is not None or p.selected is not None:
            raise FoldError("EditsScreened before the merge, after the selection, or twice")
        return replace(state, progress=replace(p, screened=event))

    if isinstance(event, EditsSelected):
        p = _progress(state, event)
        return replace(state, progress=replace(p, selected=event))

    if isinstance(event, CandidateBuilt) and reviewed(state.progress):  # the candidate rebuilt after a review
        return fold_rebuilt(state, _progress(state, event), event)

    if isinstance(event, CandidateBuilt):  # a repaired candidate (after EditsAblated) is evaluated anew
        p = _progress(state, event)
        return replace(state, progress=replace(p, candidate=event, evaluation=None))

    if isinstance(event, EditsAblated):
        p = _progress(state, event)
        if p.evaluation is None or p.repair is not None:
            raise FoldError("EditsAblated before the candidate was evaluated, or twice")
        # an edit dropped, or applied without a clause, counts as rejected as it was proposed
        dropped = [a.edit for a in event.ablations if a.harmful and (a.index in event.dropped
                                                                    or a.index in event.trimmed)]
        return replace(state, progress=replace(p, repair=event),
                       rejected_edits=_count_edits(state.rejected_edits, dropped))

    if isinstance(event, CandidateChecked):
        p = _progress(state, event)
        if p.candidate is None or p.checked is not None or p.evaluation is not None:
            raise FoldError("CandidateChecked before the candidate, after its evaluation, or twice")
        return replace(state, progress=replace(p, checked=event))

    if isinstance(event, BlockerSearched):
        p = _progress(state, event)
        if p.evaluation is None or p.blocker is not None:
            raise FoldError("BlockerSearched before the candidate was evaluated, or twice")
        return replace(state, progress=replace(p, blocker=event))

    if isinstance(event, CandidateEvaluated):
        p = _progress(state, event)
        new = replace(state, progress=replace(p, evaluation=event))
        if event.partial is not None:  # an early reject's scores cover some items only: never cached
            return new
        key = cache_key(event.split, event.skill)
        new = replace(new, score_cache=_with(state.score_cache, key, event.scores))
        return replace(new, results_cache=_with(state.results_cache, key, event.results)) if event.results else new

    if isinstance(event, SkillsDistilled):  # mode bank: the distilled bank is current at once (not gated)
        p = _progress(state, event)
        if p.rollout is None:
            raise FoldError("SkillsDistilled before RolloutCompleted")
        return replace(state, progress=replace(p, distilled=event), current_skill=event.skill)

    if isinstance(event, BankValidated):
        p = _progress(state, event)
        if event.skill != state.current_skill:
            raise FoldError("BankValidated of a bank that is not the current one")
        key = cache_key(event.split, event.skill)
        new = replace(state, progress=replace(p, validated=event), current_score=event.scores.gate,
                      score_cache=_with(state.score_cache, key, event.scores), bank_checked=event.skill)
        if event.results:
            new = replace(new, results_cache=_with(state.results_cache, key, event.results))
        if event.kept is False:  # distillation rolled back: the bank last kept is current again
            if event.checked is None or event.checked_score is None:
                raise FoldError("BankValidated rolls back to no bank")
            return replace(new, current_skill=event.checked, current_score=event.checked_score,
                           bank_checked=event.checked)
        if state.best_score is None or event.scores.gate > state.best_score:
            new = replace(new, best_skill=event.skill, best_score=event.scores.gate, best_step=event.step)
        return new

    if isinstance(event, BankEvolved):
        p = _progress(state, event)
        return replace(state, progress=replace(p, evolved=event))

    if isinstance(event, (PolicyStarted, PolicyTrained, PolicyValidated, PolicyBankEvolved)):
        return reduce_policy(state, event)

    if isinstance(event, (ReviewRequested, ReviewDecided)):  # review (skillstate.log.review_fold)
        return fold_review(state, _progress(state, event), event)

    if isinstance(event, GateDecided):
        p = _progress(state, event)
        check_gate(p, event)  # a step under review ends as its decision says
        current_skill, current_score = state.current_skill, state.current_score
        best_skill, best_score, best_step = state.best_skill, state.best_score, state.best_step
        bank_checked = state.bank_checked
        if event.decision in gate_rules.ACCEPTED:
            if p.candidate is None or event.candidate_score is None:
                raise FoldError("GateDecided accepts a step without a candidate")
            current_skill, current_score = p.candidate.skill, event.candidate_score
            bank_checked = p.candidate.skill
            if event.decision == gate_rules.ACCEPT_BEST:
                best_skill, best_score, best_step = p.candidate.skill, event.candidate_score, event.step
        rejected_edits = state.rejected_edits
        if event.decision == gate_rules.REJECT and p.selected is not None:  # the repair's drops counted already
            gone = set(p.repair.dropped + p.repair.trimmed) if p.repair is not None else set()
            rejected_edits = _count_edits(rejected_edits, [e for i, e in enumerate(p.selected.edits) if i not in gone])
        record = StepRecord(step=event.step, epoch=p.epoch, edit_budget=p.edit_budget, decision=event.decision,
                            candidate_score=event.candidate_score, current_score=current_score,
                            best_score=best_score, current_skill=current_skill, best_skill=best_skill,
                            reason=event.reason, forced=event.forced)
        return replace(state, progress=None, history=state.history + (record,), rejected_edits=rejected_edits,
                       buffer=state.buffer + (_buffer_entry(p, event),),
                       current_skill=current_skill, current_score=current_score, bank_checked=bank_checked,
                       best_skill=best_skill, best_score=best_score, best_step=best_step)

    if isinstance(event, TestEvaluated):
        new = replace(state, tests=_with(state.tests, event.label, event))
        if event.label == "eval":  # an evaluation run's one score
            new = replace(new, current_score=event.scores.gate, best_score=event.scores.gate)
        return new

    if isinstance(event, (EpochCompared, SlowUpdateProposed, SlowUpdateDecided, MetaSkillWritten, EpochEnded,
                          FinalValidated)):
        return _reduce_epoch_end(state, event)

    if isinstance(event, (PruneProposed, PruneDecided)):
        return fold_prune(state, event)

    if isinstance(event, RunCompleted):
        if state.progress is not None or state.boundary is not None:
            raise FoldError("RunCompleted in the middle of a step")
        return replace(state, completed=True)

    if isinstance(event, (SelectionScored, FinalSelected)):  # final_selection (skillstate.log.selection_fold)
        return selection_fold.reduce_selection(state, event)

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
        if event.scores is not None and event.partial is None and b.slow_update is not None and b.slow_update.skill:
            key = cache_key(state.config["val_split"], b.slow_update.skill)
            new = replace(new, score_cache=_with(state.score_cache, key, event.scores))
            if event.results:  # per-item outcomes, for the paired gate (gate_rule paired)
                new = replace(new, slow_results=_with(state.slow_results, key, event.results))
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
