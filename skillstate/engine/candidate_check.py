"""The minibatch gate (`minibatch_gate`): after the update and before any validation call, the step's
candidate is rolled out on the step's own batch and compared with its parent's rollout of the same items.
Only a candidate whose summed item values there beat the parent's strictly goes on to validation; the
others are rejected by the gate unscored, as GEPA accepts a proposal on its minibatch before it spends a
full evaluation on it. The rollouts are journaled calls like any other; the stage's one event
(`CandidateChecked`) is appended at once, so resume, replay and verify reproduce it."""

from __future__ import annotations

from skillstate.config import SkillConfig
from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.engine.scoring import rollout_items
from skillstate.log.events import Event, ItemResult
from skillstate.log.events_check import CandidateChecked
from skillstate.log.reducer import RunState, StepProgress, need, step_progress
from skillstate.skillopt.gate_robust import item_value


def due(cfg: SkillConfig, p: StepProgress) -> bool:
    """The check comes next: on, outside mode bank, the step's first candidate built and not yet checked
    or evaluated (a candidate the repair or the blocker search rebuilt is not checked again)."""
    return (cfg.minibatch_gate and cfg.mode == "skill" and p.candidate is not None and p.checked is None
            and p.evaluation is None and p.repair is None and p.blocker is None)


def failed(p: StepProgress) -> bool:
    """The check ran and the candidate did not pass: the gate rejects it with no validation call."""
    return p.checked is not None and not p.checked.passed and p.evaluation is None


def total(results: list[ItemResult], cfg: SkillConfig) -> float:
    rule = gating.rule_of(cfg)
    return round(sum(item_value(r.hard, r.soft, rule) for r in results), 9)


def check(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg = ctx.config
    candidate = need(p.candidate, "CandidateBuilt")
    parent = need(p.rollout, "RolloutCompleted").results
    ids = [r.item_id for r in parent]
    before = total(parent, cfg)
    if not candidate.changed:  # the parent itself: it cannot beat itself, and nothing need be sent
        return [CandidateChecked(step=p.step, skill=candidate.skill, item_ids=ids, results=[], parent_total=before,
                                 candidate_total=before, passed=False)]
    results = rollout_items(ctx, ctx.skill(candidate.skill), [ctx.env.item(i) for i in ids])
    after = total(results, cfg)
    return [CandidateChecked(step=p.step, skill=candidate.skill, item_ids=ids, results=results, parent_total=before,
                             candidate_total=after, passed=after > before)]


def reason(p: StepProgress) -> str:
    checked = need(p.checked, "CandidateChecked")
    if not checked.results:
        return "minibatch gate: the candidate is its parent; not evaluated on val"
    return (f"minibatch gate: {checked.candidate_total:g} <= its parent's {checked.parent_total:g} on the step's "
            f"{len(checked.item_ids)} items; not evaluated on val")


def passed_note(p: StepProgress) -> str:
    """What the gate's reason adds for a candidate that passed the check."""
    c = p.checked
    if c is None or not c.passed:
        return ""
    return f"; passed the minibatch gate ({c.candidate_total:g} > {c.parent_total:g} on {len(c.item_ids)} items)"
