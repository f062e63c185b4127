"""The gate's robust rules, pure: the paired sign test (`gate_rule: paired`)
and the per-task-type regression guard (`gate_type_margin`), with the exact
early-reject bound for them.

The paired test compares the candidate with the current skill item by item
on the same selection items: each item's gate metric value (hard, soft or
mixed) is a win, a loss or a tie. Under the null hypothesis that the
candidate is no better, a win and a loss are equally likely on every item
that differs, so the one-sided p-value is P(X >= wins), X ~ Binomial(wins +
losses, 1/2) (the exact sign test; for 0/1 scores it is the exact McNemar
test). It is computed in integers and compared with 1 - confidence as
exact fractions: no sampling, no rounding, the same answer everywhere.

Early reject: every item's value lies in [0, 1], and the best the unscored
items can do is score 1 each. That completion gives the highest mean (the
strict rule's bound), the most wins and fewest losses (each item's sign is
as high as it can be, and the p-value falls as a sign rises), and the
least loss on every task type, all at once. So a reject is certain exactly
when that one completion is rejected.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from skillstate.skillopt.gate import ROUNDING_SLACK, gate_score, reject_is_certain, upper_bound

UNTYPED = "untyped"

# One item's outcome: (hard, soft, task type)
Outcome = tuple[float, float, str]


@dataclass(frozen=True)
class RobustRule:
    """The gate's settings the robust rules read (from the run's config)."""

    rule: str = "strict"  # strict | paired
    confidence: float = 0.9
    type_margin: float | None = None
    metric: str = "hard"
    mixed_weight: float = 0.5
    density_weight: float = 0.0

    @property
    def active(self) -> bool:
        """Whether anything beyond the strict rule applies."""
        return self.rule == "paired" or self.type_margin is not None


@dataclass(frozen=True)
class Paired:
    wins: int
    losses: int
    ties: int
    p_value: Fraction
    passed: bool


@dataclass(frozen=True)
class Guard:
    losses: dict[str, float]  # task type -> current minus candidate
    passed: bool


def type_of(task_type: str) -> str:
    return task_type or UNTYPED


def item_value(hard: float, soft: float, rule: RobustRule) -> float:
    return gate_score(hard, soft, rule.metric, rule.mixed_weight)


def sign_test_p(wins: int, losses: int) -> Fraction:
    """P(X >= wins) for X ~ Binomial(wins + losses, 1/2), exactly (1 with no discordant item)."""
    m = wins + losses
    return Fraction(sum(math.comb(m, k) for k in range(wins, m + 1)), 2 ** m)


def alpha(confidence: float) -> Fraction:
    """1 - confidence, exactly (of the float as given)."""
    return 1 - Fraction(confidence)


def paired_test(candidate: Sequence[float], current: Sequence[float], confidence: float) -> Paired:
    """The sign test of per-item values, candidate against current on the same items (paired by position)."""
    if len(candidate) != len(current):
        raise ValueError(f"paired test of {len(candidate)} against {len(current)} items")
    wins = sum(1 for c, a in zip(candidate, current, strict=True) if c > a)
    losses = sum(1 for c, a in zip(candidate, current, strict=True) if c < a)
    return _paired(wins, losses, len(candidate) - wins - losses, confidence)


def _paired(wins: int, losses: int, ties: int, confidence: float) -> Paired:
    p = sign_test_p(wins, losses)
    return Paired(wins, losses, ties, p, p <= alpha(confidence))


def type_guard(current: Mapping[str, float], candidate: Mapping[str, float], margin: float) -> Guard:
    """Per task type of the current skill, current minus candidate gate score; passes when none exceeds `margin`."""
    losses = {t: current[t] - candidate[t] for t in sorted(current) if t in candidate}
    return Guard(losses, all(loss <= margin for loss in losses.values()))


def type_values(outcomes: Iterable[Outcome], rule: RobustRule) -> dict[str, float]:
    """Each task type's gate score over `outcomes`, computed as a split's scores are (means in the given order)."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for hard, soft, t in outcomes:
        groups.setdefault(type_of(t), []).append((hard, soft))
    return {t: gate_score(sum(h for h, _ in g) / len(g), sum(s for _, s in g) / len(g), rule.metric,
                          rule.mixed_weight) for t, g in groups.items()}


@dataclass(frozen=True)
class Reference:
    """The current skill on the selection split, as the log recorded it:
    its gate score, its per-type gate scores and each item's outcome, in
    the order the candidate's items are scored."""

    score: float
    by_type: Mapping[str, float]
    outcomes: Sequence[Outcome]


@dataclass(frozen=True)
class EarlyVerdict:
    """What the best completion of a scored prefix gives."""

    bound: float  # the highest gate score the candidate can still reach
    strict_certain: bool  # that bound cannot beat the current score
    paired: Paired | None
    guard: Guard | None
    guard_certain: bool

    @property
    def certain(self) -> bool:
        """A reject is certain whatever the unscored items give."""
        return (self.strict_certain or (self.paired is not None and not self.paired.passed)
                or self.guard_certain)


def best_completion(prefix: Sequence[Outcome], reference: Reference, density: float,
                    rule: RobustRule, cost: float = 0.0) -> EarlyVerdict:
    """The verdicts of the candidate whose scored items are `prefix` (the
    first len(prefix) items of `reference.outcomes`, in that order) and
    whose other items all score 1."""
    n, k = len(reference.outcomes), len(prefix)
    hard_sum = sum(h for h, _, _ in prefix)
    soft_sum = sum(s for _, s, _ in prefix)
    exact = (rule.metric == "hard" and rule.density_weight == 0 and cost == 0
             and all(h in (0.0, 1.0) for h, _, _ in prefix))
    bound = upper_bound(hard_sum, soft_sum, k, n, rule.metric, rule.mixed_weight, density, rule.density_weight,
                        cost)
    strict_certain = reject_is_certain(bound, reference.score, exact)
    paired = None
    if rule.rule == "paired":
        top = item_value(1.0, 1.0, rule)
        signs = [_sign(item_value(h, s, rule), item_value(rh, rs, rule))
                 for (h, s, _), (rh, rs, _) in zip(prefix, reference.outcomes[:k], strict=True)]
        signs += [_sign(top, item_value(rh, rs, rule)) for rh, rs, _ in reference.outcomes[k:]]
        paired = _paired(signs.count(1), signs.count(-1), signs.count(0), rule.confidence)
    guard, guard_certain = None, False
    if rule.type_margin is not None:
        completed = list(prefix) + [(1.0, 1.0, t) for _, _, t in reference.outcomes[k:]]
        guard = type_guard(reference.by_type, type_values(completed, rule), rule.type_margin)
        slack = 0.0 if rule.metric == "hard" and all(h in (0.0, 1.0) for h, _, _ in prefix) else ROUNDING_SLACK
        guard_certain = any(loss > rule.type_margin + slack for loss in guard.losses.values())
    return EarlyVerdict(bound, strict_certain, paired, guard, guard_certain)


def _sign(candidate: float, current: float) -> int:
    return (candidate > current) - (candidate < current)


def robust_reject_point(outcomes: Sequence[Outcome], reference: Reference, density: float,
                        rule: RobustRule, cost: float = 0.0) -> tuple[int, EarlyVerdict] | None:
    """(k, verdict): the fewest items, scored in the order of
    `reference.outcomes`, after which a reject is certain under `rule`;
    None when no prefix of `outcomes` proves one. As for the strict rule,
    the last item is never used: with every item scored the gate decides
    from the full evaluation."""
    n = len(reference.outcomes)
    for k in range(1, min(len(outcomes), n - 1) + 1):
        verdict = best_completion(outcomes[:k], reference, density, rule, cost)
        if verdict.certain:
            return k, verdict
    return None
