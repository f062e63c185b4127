"""Properties of the repair's pure parts (`skillstate.skillopt.repair`): which types
a candidate lost, which edits are ablated, which one is dropped, and the
edits the repaired candidate keeps. The worlds here are small deterministic
models: each item's outcome is a function of the set of edits present."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.skillopt import repair

TYPES = ["a", "b", "c", "d"]
values = st.sampled_from([0.0, 0.25, 0.5, 1.0])


def harmful_of(found: list[repair.Verdict]) -> list[int]:
    """The edits the repair drops (whole-edit ablations: a verdict's index is the edit's)."""
    return sorted(v.index for v in found if v.harmful)


@st.composite
def worlds(draw):
    """Edits (some harmful: each breaks a set of items), items with a type and
    a base outcome, and the outcome function of a set of edits."""
    n_edits = draw(st.integers(2, 6))
    n_items = draw(st.integers(1, 12))
    types = [draw(st.sampled_from(TYPES)) for _ in range(n_items)]
    base = [draw(values) for _ in range(n_items)]
    harmful = {i: draw(st.sets(st.integers(0, n_items - 1), min_size=1))
               for i in range(n_edits) if draw(st.booleans())}

    def outcome(present: frozenset[int]) -> list[float]:
        broken = set().union(*(harmful[i] for i in present if i in harmful)) if present else set()
        return [0.0 if k in broken else base[k] for k in range(n_items)]

    return n_edits, types, harmful, outcome


@settings(max_examples=300, deadline=None)
@given(worlds(), st.data())
def test_ablating_edits_none_of_which_is_harmful_drops_nothing_and_keeps_the_candidate(world, data):
    n_edits, _types, harmful, outcome = world
    harmless = [i for i in range(n_edits) if i not in harmful]
    ablated = data.draw(st.lists(st.sampled_from(harmless), unique=True) if harmless else st.just([]))
    everything = frozenset(range(n_edits))
    candidate = outcome(everything)
    found = repair.verdicts({i: outcome(everything - {i}) for i in ablated}, candidate)
    assert all(v.recovered == 0 and not v.harmful for v in found)
    dropped = harmful_of(found)
    assert dropped == []
    edits = list(range(n_edits))  # stand-ins: the repaired candidate is the candidate
    assert repair.repaired_edits(edits, dropped, {}) == edits


@settings(max_examples=300, deadline=None)
@given(worlds(), st.data())
def test_a_harmful_edit_ablated_among_harmless_ones_is_the_one_dropped_when_its_removal_recovers_items(world, data):
    n_edits, _types, harmful, outcome = world
    if not harmful:
        return
    culprit = data.draw(st.sampled_from(sorted(harmful)))
    harmless = [i for i in range(n_edits) if i not in harmful]
    ablated = [culprit] + (data.draw(st.lists(st.sampled_from(harmless), unique=True)) if harmless else [])
    everything = frozenset(range(n_edits))
    candidate = outcome(everything)
    found = repair.verdicts({i: outcome(everything - {i}) for i in ablated}, candidate)
    recovered = repair.recovery(outcome(everything - {culprit}), candidate)
    assert recovered >= 0  # removing an edit that only breaks never loses anything
    assert harmful_of(found) == ([culprit] if recovered > 0 else [])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 8), st.lists(values, min_size=3, max_size=3), max_size=6),
       st.lists(values, min_size=3, max_size=3))
def test_at_most_one_edit_is_dropped_and_it_recovers_strictly_the_most(outcomes, candidate):
    found = repair.verdicts(outcomes, candidate)
    assert [v.index for v in found] == sorted(outcomes)
    dropped = harmful_of(found)
    assert len(dropped) <= 1
    if dropped:
        top = next(v for v in found if v.index == dropped[0])
        assert top.recovered > 0 and all(v.recovered < top.recovered for v in found if v is not top)
    else:  # nothing recovered, or two ablations recovered the same most: no culprit stands out
        best = max((v.recovered for v in found), default=0.0)
        assert best <= 0 or sum(1 for v in found if v.recovered == best) > 1
    kept = repair.repaired_edits(list(range(9)), dropped, {})
    assert sorted(kept + dropped) == list(range(9)) and kept == sorted(kept)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(TYPES), values, values), max_size=20), st.sampled_from([0.0, 0.1, 0.25]))
def test_affected_types_are_those_lost_by_more_than_the_threshold_and_only_when_another_was_lifted(items, min_loss):
    changes = repair.type_changes(items)
    assert set(changes) == {t for t, _, _ in items}
    for t in changes:
        diffs = [c - r for tt, c, r in items if tt == t]
        assert abs(changes[t] - sum(diffs) / len(diffs)) < 1e-9
    assert repair.type_changes(list(reversed(items))) == changes  # order does not matter
    affected = repair.affected_types(changes, min_loss)
    assert affected == sorted(affected) and all(-changes[t] > min_loss for t in affected)
    if affected:
        assert any(d > 0 for d in changes.values())
        assert affected == sorted(t for t, d in changes.items() if -d > min_loss)
    if all(c == r for _, c, r in items):  # a candidate identical on every item has nothing to repair
        assert affected == []
    assert set(repair.affected_types(changes, min_loss + 0.1)) <= set(affected)  # a higher threshold, fewer types


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), unique=True), st.dictionaries(st.integers(0, 9), st.integers(1, 8)),
       st.integers(0, 6))
def test_ablations_are_bounded_applied_edits_in_order_the_least_supported_first(applied, support, limit):
    chosen = repair.choose_ablations(applied, support, limit)
    assert len(chosen) <= max(limit, 0) and set(chosen) <= set(applied)
    assert chosen == [i for i in applied if i in set(chosen)]  # in the order applied
    if len(applied) < 2 or limit <= 0:
        assert chosen == []
    elif len(applied) <= limit:
        assert chosen == applied
    else:
        left_out = [i for i in applied if i not in chosen]
        assert len(chosen) == limit
        assert max(support.get(j, 0) for j in chosen) <= min(support.get(i, 0) for i in left_out)


@given(st.lists(values, max_size=5), st.lists(values, max_size=5))
def test_recovery_needs_the_same_items(a, b):
    if len(a) != len(b):
        try:
            repair.recovery(a, b)
        except ValueError:
            return
        raise AssertionError("outcomes of different items compared")
    assert abs(repair.recovery(a, b) + repair.recovery(b, a)) < 1e-9
