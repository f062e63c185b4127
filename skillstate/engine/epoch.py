"""The epoch boundary (from epoch 2): compare the skill the epoch started
from with the current one on the same seeded train items, then the slow
update (the protected guidance block) and the meta skill (a memo to the
optimizer). Also the final validation of the slow-updated current skill."""

from __future__ import annotations

from typing import Any

from skillstate.config import SkillConfig
from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.engine.parsing import GuidanceReply, MemoReply, Reply, parse_reply
from skillstate.engine.prompting import compose, to_json
from skillstate.engine.scoring import evaluate_cached, evaluate_early, rollout_items
from skillstate.engine.stages import early_reject_reason
from skillstate.llm.base import CallResult
from skillstate.log.events import Event, ItemResult
from skillstate.log.events_epoch import (
    EpochCompared,
    EpochEnded,
    FinalValidated,
    MetaSkillWritten,
    SlowUpdateDecided,
    SlowUpdateProposed,
)
from skillstate.log.reducer import RunState, boundary_progress, cache_key, need
from skillstate.skillopt import gate as gate_rules
from skillstate.skillopt.guidance import compare, select_pairs, with_guidance
from skillstate.skillopt.tree_edits import md_of, with_md
from skillstate.util import seeded_rng

NONE_YET = "(none yet)"


def boundary_epoch(config: SkillConfig, state: RunState) -> int | None:
    """The epoch whose boundary work is due now, or None."""
    last = state.last_completed_step
    if state.progress is not None or last == 0 or state.steps_per_epoch == 0 or last % state.steps_per_epoch:
        return None
    epoch = last // state.steps_per_epoch
    if epoch < 2 or epoch <= state.closed_epoch:
        return None
    return epoch if config.use_slow_update or memo_due(config, state) else None


def memo_due(config: SkillConfig, state: RunState) -> bool:
    """A meta-skill memo is written only when a later epoch will read it."""
    return config.use_meta_skill and state.last_completed_step < state.total_steps


def boundary_stage(config: SkillConfig, state: RunState) -> str:
    """The next stage of the boundary work under way (or about to start)."""
    b = state.boundary
    if b is None:
        return "epoch_compare"
    if config.use_slow_update and b.slow_update is None:
        return "slow_update"
    if config.use_slow_update and b.slow_decision is None:
        return "slow_update_decide"
    if memo_due(config, state) and b.meta is None:
        return "meta_skill"
    return "end_epoch"


def compare_epochs(ctx: RunContext, state: RunState) -> list[Event]:
    epoch = state.last_completed_step // state.steps_per_epoch
    previous, current = state.epoch_skills[epoch], need(state.current_skill, "the current skill")
    ids = [item["id"] for item in ctx.env.items(ctx.config.train_split)]
    n = min(ctx.config.slow_update_samples, len(ids))
    sample = seeded_rng("slow_update", ctx.config.seed, epoch).sample(ids, n)
    items = [ctx.env.item(i) for i in sample]
    before = rollout_items(ctx, ctx.skill(previous), items)
    after = rollout_items(ctx, ctx.skill(current), items)
    labels = compare([(r.item_id, r.hard) for r in before], [(r.item_id, r.hard) for r in after])
    return [EpochCompared(epoch=epoch, previous_skill=previous, skill=current, item_ids=sample,
                          previous_results=before, results=after, labels=labels)]


def comparison_view(ctx: RunContext, comparison: EpochCompared) -> list[dict[str, Any]]:
    """The compared items the pair policy keeps, regressions first."""
    before = {r.item_id: r for r in comparison.previous_results}
    after = {r.item_id: r for r in comparison.results}

    def side(r: ItemResult) -> dict[str, Any]:
        return {"prediction": r.prediction, "hard": r.hard, "fail_reason": r.fail_reason}

    out = []
    for item_id in select_pairs(comparison.labels, ctx.config.longitudinal_pair_policy):
        view = ctx.env.describe_item(ctx.env.item(item_id))
        view.update(label=comparison.labels[item_id], previous=side(before[item_id]), current=side(after[item_id]))
        out.append(view)
    return out


def _ask(ctx: RunContext, state: RunState, name: str, model: type[Reply], field: str,
         **values: Any) -> tuple[str, Reply | None, CallResult]:
    """One epoch-boundary optimizer call over the comparison: (status, reply, call result)."""
    comparison = boundary_progress(state).comparison
    result = ctx.optimizer(compose(ctx, state, name, comparison=to_json(comparison_view(ctx, comparison)),
                                   previous_skill=ctx.skill(comparison.previous_skill),
                                   skill=ctx.skill(comparison.skill), **values), reply=model)
    if not result.ok:
        return "error", None, result
    reply = parse_reply(result.text, model)
    if reply is None or not getattr(reply, field).strip():
        return "unparseable", None, result
    return "ok", reply, result


def slow_update(ctx: RunContext, state: RunState) -> list[Event]:
    epoch = boundary_progress(state).epoch
    status, reply, result = _ask(ctx, state, "slow_update", GuidanceReply, "guidance",
                                 guidance=state.guidance or NONE_YET)
    if reply is None:
        return [SlowUpdateProposed(epoch=epoch, status=status, reasoning=result.error or "", call=result.ref)]
    current = ctx.skill(need(state.current_skill, "the current skill"))  # the block lives in SKILL.md
    skill = ctx.put_skill(with_md(current, with_guidance(md_of(current), reply.guidance,
                                                         front_matter=ctx.config.protect_front_matter)))
    return [SlowUpdateProposed(epoch=epoch, status="ok", guidance=reply.guidance.strip("\n"),
                               reasoning=reply.reasoning, skill=skill, call=result.ref)]


def slow_update_decide(ctx: RunContext, state: RunState) -> list[Event]:
    """Score the slow-updated skill; force it into the current skill, or gate it."""
    b = boundary_progress(state)
    su = need(b.slow_update, "SlowUpdateProposed")
    current, best = need(state.current_score, "the current score"), need(state.best_score, "the best score")
    common: dict[str, Any] = dict(epoch=b.epoch, current_score=current, best_score=best)
    if su.status != "ok" or not su.skill:
        return [SlowUpdateDecided(decision=gate_rules.SKIP, forced=False, candidate_score=None,
                                  reason=f"slow update reply {su.status}; the skill is unchanged", **common)]
    cfg, split = ctx.config, ctx.config.val_split
    if (cfg.slow_update_gate and cfg.early_reject and cfg.early_reject_slow_update
            and state.score_cache.get(cache_key(split, su.skill)) is None):
        scores, results, usage, partial = evaluate_early(ctx, state, su.skill, split, current)
        if partial is not None:
            event = SlowUpdateDecided(decision=gate_rules.REJECT, forced=False, candidate_score=partial.upper_bound,
                                      scores=scores, results=results, usage_by_role=usage, partial=partial,
                                      reason=early_reject_reason(partial, current), **common)
            if gating.rule_of(cfg).active:  # the robust rules' proof, in the reason
                early = gating.early_verdict(ctx, state, event, split, current)
                event = event.model_copy(update={"reason": gating.early_reason(early, current, partial.scored,
                                                                                partial.of, cfg)})
            return [event]
        blob: str | None = results
    else:
        scores, blob, usage = evaluate_cached(ctx, state, su.skill, split)
    score = scores.gate
    if cfg.slow_update_gate and gating.rule_of(cfg).active:  # the step gate's rules; verdicts in the reason
        found = gating.full_verdicts(ctx, state, split, su.skill, scores, blob)
        decision, verdict, forced = gating.decision(score, current, best, True, *found, cfg)
        reason = f"gated: {verdict}"
    elif cfg.slow_update_gate:
        decision = gate_rules.decide(score, current, best)
        reason = f"gated: {score:.4f} vs current {current:.4f}, best {best:.4f}"
        forced = False
    else:
        decision, forced = gate_rules.ACCEPT, True
        reason = f"forced into the current skill (slow_update_gate: false); it scores {score:.4f}"
    return [SlowUpdateDecided(decision=decision, forced=forced, candidate_score=score, scores=scores,
                              cached=blob is None, results=blob, reason=reason, usage_by_role=usage, **common)]


def meta_skill(ctx: RunContext, state: RunState) -> list[Event]:
    status, reply, result = _ask(ctx, state, "meta_skill", MemoReply, "memo", memo=state.memo or NONE_YET)
    memo = reply.memo.strip() if reply is not None else ""
    return [MetaSkillWritten(epoch=boundary_progress(state).epoch, status=status, memo=memo, call=result.ref)]


def end_epoch(ctx: RunContext, state: RunState) -> list[Event]:
    return [EpochEnded(epoch=boundary_progress(state).epoch, skill=need(state.current_skill, "the current skill"))]


def final_validate(ctx: RunContext, state: RunState) -> list[Event]:
    """The final current skill (slow-updated, scored on the selection split
    when it was accepted) replaces the best when it beats it."""
    score, best = state.current_score, need(state.best_score, "the best score")
    promoted = state.current_skill != state.best_skill and score is not None and score > best
    return [FinalValidated(skill=need(state.current_skill, "the current skill"), score=score, best_score=best,
                           promoted=promoted)]

