"""The robust gate in the engine (`gate_rule: paired`, `gate_type_margin`):
the current skill's per-item outcomes read from the log, the verdicts of a
full or an early-rejected evaluation, the decision and its reason. The
rules themselves are pure, in `skillstate.skillopt.gate_robust`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from skillstate.config import SkillConfig
from skillstate.engine.context import RunContext
from skillstate.errors import InternalError
from skillstate.log.events import CandidateEvaluated, ItemResult, PairedTest, Scores, TypeGuard
from skillstate.log.events_epoch import SlowUpdateDecided
from skillstate.log.prune_events import PruneDecided
from skillstate.log.reducer import RunState, cache_key, need
from skillstate.skillopt import gate as gate_rules
from skillstate.skillopt.gate_robust import (
    EarlyVerdict,
    Guard,
    Outcome,
    Paired,
    Reference,
    RobustRule,
    alpha,
    best_completion,
    item_value,
    paired_test,
    type_guard,
)

Verdicts = tuple[PairedTest | None, TypeGuard | None]


def rule_of(cfg: SkillConfig) -> RobustRule:
    return RobustRule(rule=cfg.gate_rule, confidence=cfg.gate_confidence, type_margin=cfg.gate_type_margin,
                      metric=cfg.gate_metric, mixed_weight=cfg.gate_mixed_weight,
                      density_weight=cfg.semantic_density_weight)


def recorded_results(ctx: RunContext, state: RunState, split: str, skill: str) -> dict[str, ItemResult]:
    """Each item's result of `skill` on `split`, as the log recorded its full evaluation."""
    key = cache_key(split, skill)
    blob = state.results_cache.get(key) or state.slow_results.get(key)
    if not blob:
        raise InternalError(f"the log holds no per-item results of skill {skill[:12]} on {split}")
    return {r.item_id: r for r in (ItemResult.model_validate(x) for x in json.loads(ctx.blob(blob)))}


def _outcome(r: ItemResult) -> Outcome:
    return (r.hard, r.soft, r.task_type)


def reference(ctx: RunContext, state: RunState, split: str, item_ids: Sequence[str], score: float) -> Reference:
    """The current skill on `split` from the log, its items in the order `item_ids`."""
    results = recorded_results(ctx, state, split, need(state.current_skill, "the current skill"))
    return Reference(score=score, by_type=current_by_type(ctx, state, split),
                     outcomes=[_outcome(_item(results, i)) for i in item_ids])


def by_type(scores: Scores, rule: RobustRule) -> dict[str, float]:
    """Each task type's gate score (without the density bonus, which is the skill's, not a type's)."""
    return {t: gate_rules.gate_score(v.hard, v.soft, rule.metric, rule.mixed_weight)
            for t, v in scores.by_task_type.items()}


def current_by_type(ctx: RunContext, state: RunState, split: str) -> dict[str, float]:
    current = need(state.current_skill, "the current skill")
    return by_type(need(state.score_cache.get(cache_key(split, current)), "the current skill's scores"),
                   rule_of(ctx.config))


def _item(results: dict[str, ItemResult], item_id: str) -> ItemResult:
    if item_id not in results:
        raise InternalError(f"item {item_id!r} has no recorded result to pair with")
    return results[item_id]


def early_check(ctx: RunContext, state: RunState, split: str, order: Sequence[dict[str, Any]], score: float,
                density: float, cost: float = 0.0) -> Callable[[list[ItemResult]], tuple[int, float] | None]:
    """For `scoring.evaluate_early`: given the scored prefix (in `order`),
    (its length, the score bound) once it proves a reject, else None."""
    ref = reference(ctx, state, split, [i["id"] for i in order], score)
    rule = rule_of(ctx.config)

    def check(prefix: list[ItemResult]) -> tuple[int, float] | None:
        if len(prefix) >= len(order):  # the last item is never used: a full evaluation decides as usual
            return None
        verdict = best_completion([_outcome(r) for r in prefix], ref, density, rule, cost)
        return (len(prefix), verdict.bound) if verdict.certain else None

    return check


def _candidate_results(ctx: RunContext, state: RunState, split: str, skill: str,
                       results_blob: str | None) -> dict[str, ItemResult]:
    if results_blob is None:  # served from the score cache: its full evaluation is in the log
        return recorded_results(ctx, state, split, skill)
    return {r.item_id: r for r in (ItemResult.model_validate(x) for x in json.loads(ctx.blob(results_blob)))}


def full_verdicts(ctx: RunContext, state: RunState, split: str, skill: str, scores: Scores,
                  results_blob: str | None) -> tuple[Paired | None, Guard | None]:
    """The robust rules' verdicts on a fully scored candidate."""
    rule = rule_of(ctx.config)
    paired = guard = None
    if rule.rule == "paired":
        current = recorded_results(ctx, state, split, need(state.current_skill, "the current skill"))
        candidate = _candidate_results(ctx, state, split, skill, results_blob)
        ids = sorted(current)
        paired = paired_test([item_value(_item(candidate, i).hard, _item(candidate, i).soft, rule) for i in ids],
                             [item_value(current[i].hard, current[i].soft, rule) for i in ids], rule.confidence)
    if rule.type_margin is not None:
        guard = type_guard(current_by_type(ctx, state, split), by_type(scores, rule), rule.type_margin)
    return paired, guard


def early_verdict(ctx: RunContext, state: RunState, evaluation: CandidateEvaluated | SlowUpdateDecided | PruneDecided,
                  split: str, score: float) -> EarlyVerdict:
    """The verdict that proved an early reject, recomputed from the recorded prefix."""
    part = need(evaluation.partial, "an early reject")
    scores = need(evaluation.scores, "its scores")
    density, cost = scores.density, scores.length_cost
    scored = [ItemResult.model_validate(x) for x in json.loads(ctx.blob(need(evaluation.results, "its results")))]
    rest = [i["id"] for i in ctx.env.items(split) if i["id"] not in set(part.item_ids)]
    ref = reference(ctx, state, split, list(part.item_ids) + rest, score)
    return best_completion([_outcome(r) for r in scored], ref, density, rule_of(ctx.config), cost)


def recorded(paired: Paired | None, guard: Guard | None, cfg: SkillConfig, bound: bool = False) -> Verdicts:
    """The verdicts as `GateDecided` holds them."""
    p = None if paired is None else PairedTest(wins=paired.wins, losses=paired.losses, ties=paired.ties,
                                               p_value=float(paired.p_value), confidence=cfg.gate_confidence,
                                               passed=paired.passed, bound=bound)
    g = None if guard is None else TypeGuard(margin=float(cfg.gate_type_margin or 0.0), losses=guard.losses,
                                             passed=guard.passed, bound=bound)
    return p, g


def paired_text(p: Paired, confidence: float) -> str:
    a = alpha(confidence)
    return (f"paired {p.wins} won, {p.losses} lost, {p.ties} tied: p {float(p.p_value):.4f} "
            f"{'<=' if p.passed else '>'} {float(a):.4f}")


def guard_text(g: Guard, margin: float) -> str:
    over = {t: loss for t, loss in g.losses.items() if loss > margin}
    if over:
        return "type guard: " + ", ".join(f"{t} loses {loss:.4f}" for t, loss in over.items()) + f" > {margin:g}"
    worst = max(g.losses.items(), key=lambda kv: (kv[1], kv[0]), default=None)
    return f"type guard: no type loses more than {margin:g}" + (
        f" (worst {worst[0]} {worst[1]:+.4f})" if worst is not None and worst[1] > 0 else "")


def decision(score: float, current: float, best: float, use_gate: bool, paired: Paired | None,
             guard: Guard | None, cfg: SkillConfig) -> tuple[str, str, bool]:
    """(decision, reason, forced) under the robust rules: accept only when
    the score beats the current one and every configured rule passes."""
    strict = score > current
    passed = strict and (paired is None or paired.passed) and (guard is None or guard.passed)
    parts = [f"{score:.4f} > best {best:.4f}" if passed and score > best
             else f"{score:.4f} {'>' if strict else '<='} current {current:.4f}"]
    if paired is not None:
        parts.append(paired_text(paired, cfg.gate_confidence))
    if guard is not None:
        parts.append(guard_text(guard, float(cfg.gate_type_margin or 0.0)))
    reason = "; ".join(parts)
    accepted = gate_rules.ACCEPT_BEST if score > best else gate_rules.ACCEPT
    if not use_gate:
        return accepted, reason + ("" if passed else "; forced accept (use_gate: false)"), True
    return (accepted if passed else gate_rules.REJECT), reason, False


def early_reason(verdict: EarlyVerdict, current: float, scored: int, of: int, cfg: SkillConfig) -> str:
    """What proved an early reject under the robust rules."""
    proofs = []
    if verdict.strict_certain:
        proofs.append(f"at most {verdict.bound:.4f} <= current {current:.4f}")
    if verdict.paired is not None and not verdict.paired.passed:
        proofs.append("at best " + paired_text(verdict.paired, cfg.gate_confidence))
    if verdict.guard is not None and verdict.guard_certain:
        proofs.append("at best " + guard_text(verdict.guard, float(cfg.gate_type_margin or 0.0)))
    return "; ".join(proofs) + f": rejected early, after {scored} of {of} items"
