"""The stages of SkillOpt. Each takes the run context and the folded state
and returns the events it produces; none of them writes anything itself."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from skillstate.config import SkillConfig
from skillstate.engine import candidate_check, gating
from skillstate.engine.blockers import gate_note as blocker_note
from skillstate.engine.context import RunContext
from skillstate.engine.scoring import (
    evaluate,
    evaluate_cached,
    evaluate_early,
    rollout_items,
    rollout_jobs,
    summarize,
)
from skillstate.log.events import (
    BaselineEvaluated,
    CandidateEvaluated,
    Event,
    GateDecided,
    PartialEval,
    RolloutCompleted,
    RunCompleted,
    Scores,
    StepStarted,
    TestEvaluated,
    usage_of,
)
from skillstate.log.events_pareto import FrontMember, ParentChosen
from skillstate.log.reducer import RunState, cache_key, need, step_progress
from skillstate.skillopt import gate as gate_rules
from skillstate.skillopt import pareto
from skillstate.skillopt import repair as repair_rules
from skillstate.skillopt.gate_robust import item_value
from skillstate.skillopt.repair import gate_note as repair_note
from skillstate.skillopt.scheduler import edit_budget, epoch_batches, position
from skillstate.util import canonical_json


def baseline(ctx: RunContext, state: RunState) -> list[Event]:
    # the skill the steps start from: the initial one, or (mode bank) the bank seeded from imported trajectories
    split, skill = ctx.config.val_split, need(state.start_skill, "the initial skill")
    scores, blob, usage = evaluate(ctx, skill, split)
    return [BaselineEvaluated(split=split, skill=skill, scores=scores, results=blob, usage_by_role=usage)]


def step_batches(ctx: RunContext, state: RunState, step: int) -> list[list[str]]:
    """The train item ids of `step`, one list per sub-batch (the seeded shuffle of its epoch)."""
    cfg = ctx.config
    epoch, index = position(step, state.steps_per_epoch)
    train_ids = [item["id"] for item in ctx.env.items(cfg.train_split)]
    k = cfg.accumulation
    return epoch_batches(train_ids, cfg.seed, epoch, cfg.batch_size, k)[(index - 1) * k: index * k]


def calls_spent(cfg: SkillConfig, state: RunState) -> bool:
    """`max_calls`: the run's LLM calls so far (every role, as its events count them) reach the limit, so no
    step starts (the same count on replay, and on a fork that inherits the parent's steps)."""
    return cfg.max_calls is not None and sum(u.calls for u in state.usage.values()) >= cfg.max_calls


def start_step(ctx: RunContext, state: RunState) -> list[Event]:
    cfg = ctx.config
    step = state.last_completed_step + 1
    epoch, _ = position(step, state.steps_per_epoch)
    k = cfg.accumulation
    batches = step_batches(ctx, state, step)
    budget = edit_budget(step, state.total_steps, cfg.edit_budget, cfg.min_edit_budget, cfg.lr_scheduler)
    started = StepStarted(step=step, epoch=epoch, batch_item_ids=[i for b in batches for i in b],
                          edit_budget=budget, sub_batches=batches if k > 1 else [])
    if cfg.parent_selection != "current":
        return [started, *choose_parent(ctx, state, step)]
    return [started]


def parent_pool(state: RunState, split: str) -> list[tuple[str, Scores]]:
    """The skills a parent is drawn from: the one the steps started from and
    every skill current after a step (in that order, each once), those with
    a full score on `split` in the log."""
    skills = [state.start_skill, *(rec.current_skill for rec in state.history), state.current_skill]
    out: dict[str, Scores] = {}
    for skill in skills:
        scores = state.score_cache.get(cache_key(split, skill or ""))
        if skill and scores is not None and skill not in out:
            out[skill] = scores
    return list(out.items())


def choose_parent(ctx: RunContext, state: RunState, step: int) -> list[Event]:
    """parent_selection pareto: the step's parent, drawn from the front of
    the pool (none with fewer than two skills in it: the current one it is)."""
    cfg = ctx.config
    pool = parent_pool(state, cfg.val_split)
    current = need(state.current_skill, "the current skill")
    if len(pool) < 2:
        return []
    if cfg.parent_selection == "items":  # GEPA's front: per val item
        keyed = [(skill, item_values(ctx, state, cfg.val_split, skill)) for skill, _ in pool]
    else:
        keyed = [(skill, {t: gate_rules.gate_score(s.hard, s.soft, cfg.gate_metric, cfg.gate_mixed_weight)
                          for t, s in scores.by_task_type.items()}) for skill, scores in pool]
    members = pareto.front(keyed)
    chosen = pareto.draw(members, cfg.seed, step)
    overall = {skill: gate_rules.gate_of(scores, cfg.gate_metric, cfg.gate_mixed_weight, cfg.semantic_density_weight)
               for skill, scores in pool}
    score = overall[chosen]
    front = [FrontMember(skill=skill, score=overall[skill], types=types) for skill, types in members.items()]
    kept = "kept the current skill" if chosen == current else "switched from the current skill"
    return [ParentChosen(step=step, skill=chosen, score=score, previous_skill=current, front=front, pool=len(pool),
                         reason=f"drew 1 of {len(front)} on the front of {len(pool)} skills ({kept}); it leads "
                                + (f"{len(members[chosen])} val items" if cfg.parent_selection == "items"
                                   else ', '.join(members[chosen])))]


def item_values(ctx: RunContext, state: RunState, split: str, skill: str) -> dict[str, float]:
    """Each item's value (the gate's metric) for `skill` on `split`, from its full evaluation in the log."""
    rule = gating.rule_of(ctx.config)
    return {i: item_value(r.hard, r.soft, rule) for i, r in gating.recorded_results(ctx, state, split, skill).items()}


def rollout(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    results = rollout_items(ctx, ctx.skill(p.base_skill), [ctx.env.item(i) for i in p.batch_item_ids])
    return [RolloutCompleted(step=p.step, skill=p.base_skill, results=results)]


# --- gate ------------------------------------------------------------------


def evaluate_candidate(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg = ctx.config
    split, skill = cfg.val_split, need(p.candidate, "CandidateBuilt").skill
    # the repair pairs every item, unless it pairs early reject's prefix (`repair_prefix`) in every mode
    full = cfg.repair_full_evaluation and not cfg.repair_prefix and repair_rules.may_examine(cfg, p)
    if cfg.early_reject and cfg.use_gate and not full and state.score_cache.get(cache_key(split, skill)) is None:
        current = need(state.current_score, "the current score")
        scores, blob, usage, partial = evaluate_early(ctx, state, skill, split, current)
        return [CandidateEvaluated(step=p.step, split=split, skill=skill, scores=scores, cached=False, results=blob,
                                   usage_by_role=usage, partial=partial)]
    scores, maybe_blob, usage = evaluate_cached(ctx, state, skill, split)
    return [CandidateEvaluated(step=p.step, split=split, skill=skill, scores=scores, cached=maybe_blob is None,
                               results=maybe_blob, usage_by_role=usage)]


def decide(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    current, best = need(state.current_score, "the current score"), need(state.best_score, "the best score")
    if ctx.config.mode == "bank":
        from skillstate.engine.bank import skip_reason as bank_skip_reason  # bank imports this module

        skip = bank_skip_reason(ctx.config, state)
    else:
        skip = skip_reason(state, ctx.config.update_mode)
    if skip:
        return [GateDecided(step=p.step, decision=gate_rules.SKIP, candidate_score=None, current_score=current,
                            best_score=best, reason=skip)]
    if candidate_check.failed(p):
        return [GateDecided(step=p.step, decision=gate_rules.REJECT, candidate_score=None, current_score=current,
                            best_score=best, reason=candidate_check.reason(p))]
    evaluation = need(p.evaluation, "CandidateEvaluated")
    candidate = need(p.candidate, "CandidateBuilt")
    cfg = ctx.config
    robust = gating.rule_of(cfg).active
    if evaluation.partial is not None:
        part = evaluation.partial
        if not robust:
            return [GateDecided(step=p.step, decision=gate_rules.REJECT, candidate_score=part.upper_bound,
                                current_score=current, best_score=best,
                                reason=early_reject_reason(part, current) + repair_note(p.repair)
                                + blocker_note(state))]
        early = gating.early_verdict(ctx, state, evaluation, evaluation.split, current)
        paired, guard = gating.recorded(early.paired, early.guard, cfg, bound=True)
        return [GateDecided(step=p.step, decision=gate_rules.REJECT, candidate_score=part.upper_bound,
                            current_score=current, best_score=best, rule=cfg.gate_rule, paired=paired,
                            type_guard=guard, reason=gating.early_reason(early, current, part.scored, part.of, cfg)
                            + repair_note(p.repair) + blocker_note(state))]
    score = evaluation.scores.gate
    verdicts: gating.Verdicts = (None, None)
    if robust:
        found = gating.full_verdicts(ctx, state, evaluation.split, evaluation.skill, evaluation.scores,
                                     evaluation.results)
        decision, reason, forced = gating.decision(score, current, best, cfg.use_gate, *found, cfg)
        verdicts = gating.recorded(*found, cfg)
    else:
        decision, reason, forced = gate_decision(score, current, best, cfg.use_gate)
    if not candidate.changed:
        reason += "; candidate identical to the current skill"
    if candidate.status != "ok":
        reason += f"; the rewrite call failed ({candidate.status})"
    reason += candidate_check.passed_note(p) + repair_note(p.repair) + blocker_note(state)
    return [GateDecided(step=p.step, decision=decision, candidate_score=score, current_score=current,
                        best_score=best, reason=reason, forced=forced, rule=cfg.gate_rule, paired=verdicts[0],
                        type_guard=verdicts[1])]


def early_reject_reason(part: PartialEval, current: float) -> str:
    return (f"at most {part.upper_bound:.4f} <= current {current:.4f}: rejected early, after {part.scored} of "
            f"{part.of} items")


def skip_reason(state: RunState, update_mode: str) -> str | None:
    """Why the step ends without a candidate, or None when it has one to gate."""
    p = step_progress(state)
    if p.merged is None:
        return None
    if update_mode == "full_rewrite" and p.merged.skill is None:
        return "no analyst wrote a usable skill"
    if update_mode != "full_rewrite" and not p.merged.edits:
        return "no edits survived aggregation"
    if p.selected is not None and not p.selected.edits:
        dropped = p.selected.dropped
        if dropped and len(dropped) == p.selected.candidates:
            reasons = Counter(d.reason for d in dropped)
            listed = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(reasons.items()))
            if "rejected_before" in reasons or "screened_out" in reasons:  # (older logs never have them)
                return f"every proposed edit was left out before selection ({listed})"
            return f"every proposed edit would change nothing ({listed})"
        if any(d.reason == "dangling_link" for d in dropped):
            return "every selected edit linked to a file that no kept edit creates (dangling link)"
        return "the autonomous learning rate chose 0 edits"
    return None


def gate_decision(score: float, current: float, best: float, use_gate: bool) -> tuple[str, str, bool]:
    """(decision, reason, forced). With the gate off every candidate is
    accepted (still as new best when it beats the best)."""
    decision = gate_rules.decide(score, current, best)
    if not use_gate and decision == gate_rules.REJECT:
        return gate_rules.ACCEPT, f"{score:.4f} <= current {current:.4f}; forced accept (use_gate: false)", True
    reason = {
        gate_rules.ACCEPT_BEST: f"{score:.4f} > best {best:.4f}",
        gate_rules.ACCEPT: f"{score:.4f} > current {current:.4f} (best {best:.4f})",
        gate_rules.REJECT: f"{score:.4f} <= current {current:.4f}",
    }[decision]
    return decision, reason, not use_gate


# --- end of run --------------------------------------------------------------


NO_SKILL = ""  # what the target is shown in place of a skill when it is scored without one


def test_eval(label: str) -> Callable[[RunContext, RunState], list[Event]]:
    def stage(ctx: RunContext, state: RunState) -> list[Event]:
        if label == "no_skill":  # (an empty system prompt: what the skill adds over none)
            skill = ctx.put_blob(NO_SKILL)
        else:
            skill = need(state.start_skill if label == "baseline" else state.best_skill, f"the {label} skill")
        split = ctx.config.test_split
        scores, blob, usage = evaluate(ctx, skill, split)
        return [TestEvaluated(label=label, split=split, skill=skill, scores=scores, results=blob, usage_by_role=usage)]

    return stage


def eval_skill(ctx: RunContext, state: RunState) -> list[Event]:
    """An evaluation run: score its skill on its split; with `samples` G > 1,
    G distinct samples of every item (GRPO groups, `export-grpo`)."""
    split = state.eval_split or ctx.config.test_split
    skill = need(state.initial_skill, "the initial skill")
    if ctx.config.samples > 1:
        return [_sampled(ctx, skill, split)]
    scores, blob, usage = evaluate(ctx, skill, split)
    return [TestEvaluated(label="eval", split=split, skill=skill, scores=scores, results=blob, usage_by_role=usage)]


def _sampled(ctx: RunContext, skill_hash: str, split: str) -> TestEvaluated:
    """Every item of `split`, `samples` times (sample i's requests carry seed i); results item by item."""
    cfg, skill = ctx.config, ctx.skill(skill_hash)
    jobs: list[tuple[dict, int | None]] = [(item, i) for item in ctx.env.items(split) for i in range(cfg.samples)]
    results = rollout_jobs(ctx, skill, jobs)
    scores = summarize(results, cfg.gate_metric, cfg.gate_mixed_weight, skill, cfg.semantic_density_weight,
                       cfg.gate_length_penalty)
    blob = ctx.put_blob(canonical_json([r.model_dump(mode="json") for r in results]))
    return TestEvaluated(label="eval", split=split, skill=skill_hash, scores=scores, results=blob,
                         usage_by_role=usage_of([c for r in results for c in r.all_calls()]))


def complete(ctx: RunContext, state: RunState) -> list[Event]:
    return [RunCompleted(steps=state.last_completed_step, best_step=state.best_step,
                         best_score=need(state.best_score, "the best score"),
                         current_score=need(state.current_score, "the current score"),
                         best_skill=need(state.best_skill, "the best skill"))]
