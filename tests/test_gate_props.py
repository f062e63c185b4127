"""Property tests for skillstate.skillopt.gate: the acceptance rule and gate metric.

The engine folds decisions into (current, best): accept_best sets both to
the candidate, accept sets current, reject leaves both unchanged.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from skillstate.skillopt.gate import ACCEPT, ACCEPT_BEST, REJECT, decide, gate_score

SETTINGS = settings(max_examples=200, deadline=None)

# A few exact values so ties are frequent.
scores = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), st.floats(0.0, 1.0))
weights = st.floats(allow_nan=False, allow_infinity=True)


def fold(decision: str, candidate: float, current: float, best: float) -> tuple[float, float]:
    if decision == ACCEPT_BEST:
        return candidate, candidate
    if decision == ACCEPT:
        return candidate, best
    assert decision == REJECT
    return current, best


@SETTINGS
@given(scores, st.lists(scores, max_size=20))
def test_simulated_run_invariants(initial, candidates):
    current = best = initial
    for candidate in candidates:
        decision = decide(candidate, current, best)
        assert decision in (ACCEPT_BEST, ACCEPT, REJECT)
        # Acceptance is strict.
        assert (decision == ACCEPT_BEST) == (candidate > best)
        assert (decision == ACCEPT) == (best >= candidate > current)
        if candidate == current:
            assert decision == REJECT
        if candidate == best:
            assert decision != ACCEPT_BEST
        new_current, new_best = fold(decision, candidate, current, best)
        assert new_best >= best  # best never decreases
        assert new_best >= new_current
        current, best = new_current, new_best


@SETTINGS
@given(scores, scores, scores)
def test_decide_is_deterministic(candidate, current, best):
    assert decide(candidate, current, best) == decide(candidate, current, best)


@SETTINGS
@given(scores, scores, weights)
@example(hard=0.1, soft=0.1, w=0.3)  # convex combination rounds below 0.1
def test_mixed_score_between_hard_and_soft(hard, soft, w):
    score = gate_score(hard, soft, "mixed", w)
    assert min(hard, soft) <= score <= max(hard, soft)


@SETTINGS
@given(scores, scores, st.floats(max_value=0.0, allow_nan=False))
def test_mixed_weight_zero_or_below_gives_hard(hard, soft, w):
    assert gate_score(hard, soft, "mixed", 0.0) == hard
    assert gate_score(hard, soft, "mixed", w) == hard


@SETTINGS
@given(scores, scores, st.floats(min_value=1.0, allow_nan=False))
def test_mixed_weight_one_or_above_gives_soft(hard, soft, w):
    assert gate_score(hard, soft, "mixed", 1.0) == soft
    assert gate_score(hard, soft, "mixed", w) == soft


@SETTINGS
@given(scores, scores, weights)
def test_hard_and_soft_metrics_return_their_value(hard, soft, w):
    assert gate_score(hard, soft, "hard", w) == hard
    assert gate_score(hard, soft, "soft", w) == soft


@SETTINGS
@given(scores, scores, st.text(max_size=10).filter(lambda m: m not in ("hard", "soft", "mixed")))
def test_unknown_metric_raises(hard, soft, metric):
    with pytest.raises(ValueError):
        gate_score(hard, soft, metric)
