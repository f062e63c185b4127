"""Property tests of the robust gate rules (skillstate.skillopt.gate_robust and the
decision in skillstate.engine.gating): the paired sign test, the per-type
guard, and early reject under them."""

from __future__ import annotations

import math
from fractions import Fraction

from conftest import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from skillstate.config import SkillConfig
from skillstate.engine import gating
from skillstate.skillopt import gate
from skillstate.skillopt.gate_robust import (
    Reference,
    RobustRule,
    best_completion,
    item_value,
    paired_test,
    robust_reject_point,
    sign_test_p,
    type_guard,
    type_values,
)

TYPES = ["a", "b", "c", ""]
score = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1, allow_nan=False))
outcome = st.tuples(st.sampled_from([0.0, 1.0]), score, st.sampled_from(TYPES))  # (hard, soft, task type)
confidence = st.one_of(st.sampled_from([0.5, 0.8, 0.9, 0.95]), st.floats(0.5, 0.99))
margin = st.one_of(st.none(), st.sampled_from([0.0, 0.1, 0.25]), st.floats(0, 1))


def config(rule: RobustRule) -> SkillConfig:
    return SkillConfig(gate_rule=rule.rule, gate_confidence=rule.confidence, gate_type_margin=rule.type_margin,
                       gate_metric=rule.metric, gate_mixed_weight=rule.mixed_weight,
                       semantic_density_weight=rule.density_weight)


@st.composite
def rules(draw, paired=None):
    return RobustRule(rule="paired" if paired else draw(st.sampled_from(["strict", "paired"])) if paired is None
                      else "strict", confidence=draw(confidence), type_margin=draw(margin),
                      metric=draw(st.sampled_from(["hard", "soft", "mixed"])),
                      mixed_weight=draw(st.floats(0, 1, allow_nan=False)),
                      density_weight=draw(st.sampled_from([0.0, 0.0, 0.1, 0.5])))


def split_score(outcomes, rule: RobustRule, density: float) -> float:
    """What a full evaluation records (scoring.summarize): means in split order, plus the density bonus."""
    n = len(outcomes)
    hard, soft = sum(o[0] for o in outcomes) / n, sum(o[1] for o in outcomes) / n
    return gate.with_density(gate.gate_score(hard, soft, rule.metric, rule.mixed_weight), density,
                             rule.density_weight)


def full_decision(candidate, current, rule: RobustRule, cand_density: float, cur_density: float) -> str:
    """The gate's decision with every item scored, as `stages.decide` computes it."""
    score, cur = split_score(candidate, rule, cand_density), split_score(current, rule, cur_density)
    paired = guard = None
    if rule.rule == "paired":
        paired = paired_test([item_value(h, s, rule) for h, s, _ in candidate],
                             [item_value(h, s, rule) for h, s, _ in current], rule.confidence)
    if rule.type_margin is not None:
        guard = type_guard(type_values(current, rule), type_values(candidate, rule), rule.type_margin)
    return gating.decision(score, cur, max(cur, score), True, paired, guard, config(rule))[0]


# --- the sign test ------------------------------------------------------------------


@given(st.integers(0, 40), st.integers(0, 40))
def test_the_sign_test_p_value_is_the_binomial_tail(wins, losses):
    m = wins + losses
    brute = sum(Fraction(math.comb(m, k), 2 ** m) for k in range(m + 1) if k >= wins)
    assert sign_test_p(wins, losses) == brute
    assert 0 < sign_test_p(wins, losses) <= 1
    assert sign_test_p(wins + 1, losses) <= sign_test_p(wins, losses) <= sign_test_p(wins, losses + 1)


@examples(full=400, sampled=80)
def test_the_paired_gate_never_accepts_outcomes_identical_to_the_current_skills(max_examples):
    @given(st.lists(outcome, min_size=1, max_size=40), rules(paired=True), st.floats(0, 1), st.floats(-1, 1))
    @settings(max_examples=max_examples, deadline=None)
    @example(outcomes=[(1.0, 1.0, "a")], rule=RobustRule("paired", 0.5), density=1.0, below=-1.0)
    def check(outcomes, rule, density, below):
        values = [item_value(h, s, rule) for h, s, _ in outcomes]
        paired = paired_test(values, list(values), rule.confidence)
        assert (paired.wins, paired.losses, paired.ties) == (0, 0, len(outcomes)) and not paired.passed
        # even when the score beats the current one (a density bonus, a different current score), it rejects
        score = split_score(outcomes, rule, density)
        current = score + below * 0.5
        guard = None if rule.type_margin is None else type_guard(type_values(outcomes, rule),
                                                                 type_values(outcomes, rule), rule.type_margin)
        decision, reason, forced = gating.decision(score, current, min(current, score), True, paired, guard,
                                                   config(rule))
        assert decision == gate.REJECT and not forced and "paired 0 won, 0 lost" in reason

    check()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0]), st.sampled_from([0.0, 1.0])), min_size=1, max_size=60),
       confidence)
def test_with_hard_scores_the_paired_test_is_mcnemar_on_the_discordant_pairs(pairs, conf):
    rule = RobustRule("paired", conf)
    paired = paired_test([c for c, _ in pairs], [a for _, a in pairs], conf)
    b = sum(1 for c, a in pairs if c > a)
    c_ = sum(1 for c, a in pairs if c < a)
    assert (paired.wins, paired.losses) == (b, c_)
    assert paired.passed == (sign_test_p(b, c_) <= 1 - Fraction(rule.confidence))
    if paired.passed:
        assert b > c_  # with confidence >= 1/2 (the least the config allows), a pass needs more wins than losses


# --- the per-type guard ----------------------------------------------------------------


@examples(full=400, sampled=80)
def test_the_type_guard_rejects_exactly_when_some_types_loss_exceeds_the_margin(max_examples):
    @given(st.dictionaries(st.sampled_from(TYPES), st.tuples(score, score), min_size=1), st.floats(0, 1))
    @settings(max_examples=max_examples, deadline=None)
    def check(pairs, m):
        current = {t: a for t, (a, _) in pairs.items()}
        candidate = {t: c for t, (_, c) in pairs.items()}
        guard = type_guard(current, candidate, m)
        over = any(current[t] - candidate[t] > m for t in current)
        assert guard.passed == (not over)
        assert guard.losses == {t: current[t] - candidate[t] for t in current}
        # in the decision: a candidate that beats the current score is rejected exactly then
        decision, reason, _ = gating.decision(0.9, 0.5, 0.6, True, None, guard, SkillConfig(gate_type_margin=m))
        assert (decision == gate.REJECT) == over
        assert ("type guard" in reason) and ((" > " in reason.split("type guard")[1]) == over)

    check()


# --- early reject under the robust rules ----------------------------------------------------


@st.composite
def cases(draw):
    candidate = draw(st.lists(outcome, min_size=1, max_size=30))
    n = len(candidate)
    current = [(draw(st.sampled_from([0.0, 1.0])), draw(score), t) for _, _, t in candidate]  # same items, types
    order = draw(st.permutations(range(n)))
    rule = draw(rules())
    return candidate, current, order, rule, draw(st.floats(0, 1)), draw(st.floats(0, 1))


@examples(full=1000, sampled=200)
def test_an_early_reject_under_the_robust_rules_is_the_decision_a_full_evaluation_gives(max_examples):
    @given(cases())
    @settings(max_examples=max_examples, deadline=None)
    def check(case):
        candidate, current, order, rule, cand_density, cur_density = case
        cur_score = split_score(current, rule, cur_density)
        ref = Reference(score=cur_score, by_type=type_values(current, rule), outcomes=[current[i] for i in order])
        ordered = [candidate[i] for i in order]
        found = robust_reject_point(ordered, ref, cand_density, rule)
        full = full_decision(candidate, current, rule, cand_density, cur_density)
        if found is None:
            return  # the engine scores every item and decides from them: the full decision by definition
        k, verdict = found
        assert 1 <= k < len(candidate) and verdict.certain
        assert full == gate.REJECT
        assert split_score(candidate, rule, cand_density) <= verdict.bound + gate.ROUNDING_SLACK
        # the fewest items: no shorter prefix proves it
        assert robust_reject_point(ordered[: k - 1], ref, cand_density, rule) is None
        # and every other completion of the unscored items is rejected too (here: all of them fail, or copy current)
        for rest in ([(0.0, 0.0, t) for _, _, t in ordered[k:]], [current[i] for i in order[k:]]):
            completed = ordered[:k] + rest
            back = [None] * len(order)
            for pos, i in enumerate(order):
                back[i] = completed[pos]
            assert full_decision(back, current, rule, cand_density, cur_density) == gate.REJECT

    check()


@examples(full=500, sampled=100)
def test_the_best_completion_is_accepted_whenever_no_reject_is_certain(max_examples):
    @given(cases())
    @settings(max_examples=max_examples, deadline=None)
    def check(case):
        # early reject is not only safe but tight: when the bound proves nothing after n - 1 items, the
        # completion it assumed (the last item solved) is accepted by a full evaluation
        candidate, current, order, rule, cand_density, cur_density = case
        rule = RobustRule(rule.rule, rule.confidence, rule.type_margin, "hard", 0.5, 0.0)  # exact: no slack
        if len(candidate) < 2:
            return
        cur_score = split_score(current, rule, cur_density)
        ref = Reference(score=cur_score, by_type=type_values(current, rule), outcomes=[current[i] for i in order])
        ordered = [candidate[i] for i in order]
        verdict = best_completion(ordered[:-1], ref, cand_density, rule)
        completed = ordered[:-1] + [(1.0, 1.0, ordered[-1][2])]
        back = [None] * len(order)
        for pos, i in enumerate(order):
            back[i] = completed[pos]
        accepted = full_decision(back, current, rule, cand_density, cur_density) != gate.REJECT
        assert accepted == (not verdict.certain)

    check()


@settings(max_examples=300, deadline=None)
@given(st.lists(outcome, min_size=2, max_size=30), confidence, st.floats(0, 1))
def test_the_strict_rule_alone_keeps_the_strict_early_reject(outcomes, conf, density):
    # with neither robust rule on, the engine uses gate.early_reject_point; the robust bound agrees with it
    rule = RobustRule("strict", conf, None)
    current = [(0.0, 0.0, t) for _, _, t in outcomes]
    cur_score = sum(1 for h, _, _ in outcomes if h) / len(outcomes)
    ref = Reference(score=cur_score, by_type=type_values(current, rule), outcomes=current)
    robust = robust_reject_point(outcomes, ref, density, rule)
    strict = gate.early_reject_point([(h, s) for h, s, _ in outcomes], len(outcomes), cur_score, "hard", 0.5,
                                     density, 0.0)
    assert (robust[0] if robust else None) == (strict[0] if strict else None)
