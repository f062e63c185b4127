"""Properties of the minibatch screen's pure parts (`skillstate.skillopt.minibatch`): the items an edit is
tried on, whether it passes, and the order the edits that pass compete for the budget in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.skillopt import minibatch as rules

TYPES = ["a", "b", "c"]


@st.composite
def batches(draw):
    """A step's batch (item id, type, the current skill's value) and what an edit was aimed at."""
    n = draw(st.integers(0, 16))
    batch = [(f"i{k}", draw(st.sampled_from(TYPES)), draw(st.sampled_from([0.0, 1.0]))) for k in range(n)]
    failed = [(i, t) for i, t, v in batch if v < 1]
    aims = {}
    for t in draw(st.lists(st.sampled_from(TYPES), unique=True, max_size=3)):
        shown = [i for i, u in failed if u == t]
        aims[t] = draw(st.lists(st.sampled_from(shown), unique=True)) if shown else []
    return batch, aims


@settings(max_examples=150, deadline=None)
@given(batches(), st.integers(1, 4), st.integers(0, 3), st.integers(1, 12), st.integers(0, 9), st.integers(0, 2))
def test_an_edit_is_tried_on_failures_it_was_aimed_at_and_solved_items_of_other_types(b, per_type, seed, step, index,
                                                                                      others):
    batch, aims = b
    ids = rules.minibatch(aims, batch, per_type, seed, step, index, others)
    assert ids == rules.minibatch(aims, batch, per_type, seed, step, index, others)  # a function of its inputs
    of = {i: (t, v) for i, t, v in batch}
    assert len(ids) == len(set(ids)) and ids == [i for i, _, _ in batch if i in set(ids)]  # once each, batch order
    tried_types = sorted(aims, key=lambda t: (-len(aims[t]), t))[: rules.MAX_TYPES]
    solved = [i for i in ids if of[i][1] >= 1]
    failed = [i for i in ids if of[i][1] < 1]
    assert all(of[i][0] not in aims for i in solved)
    assert len(solved) == min(others, sum(1 for _, t, v in batch if v >= 1 and t not in aims))
    if aims:
        assert all(any(i in aims[t] for t in tried_types) for i in failed)
        for t in tried_types:  # per type, as many of its shown failures as there are, up to per_type
            assert sum(1 for i in failed if i in aims[t]) == min(per_type, len(aims[t]))
    else:
        assert len(failed) == min(per_type, sum(1 for _, _, v in batch if v < 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from([0.0, 1.0]), st.sampled_from([0.0, 1.0])),
                max_size=8), st.lists(st.sampled_from(TYPES), unique=True, max_size=2), st.randoms())
def test_an_edit_passes_only_when_it_wins_most_failures_of_one_aimed_type_and_gains_overall(outcomes, aimed, rnd):
    passed = rules.passes(outcomes, aimed)
    total = sum(t - c for _, t, c in outcomes)
    shuffled = list(outcomes)
    rnd.shuffle(shuffled)
    assert rules.passes(shuffled, aimed) == passed
    groups = {(t if aimed else "") for t, _, c in outcomes if c < 1 and (not aimed or t in aimed)}

    def won_most(g: str) -> bool:
        mine = [(x, c) for u, x, c in outcomes if c < 1 and (not aimed or u == g)]
        return 2 * sum(x - c for x, c in mine) > len(mine)

    assert passed == (total > 0 and any(won_most(g) for g in groups))
    if all(t <= c for _, t, c in outcomes):  # won nothing: never passes
        assert not passed
    win_all = [(t, 1.0, c) for t, _, c in outcomes]
    if any(c < 1 and (not aimed or t in aimed) for t, _, c in outcomes):
        assert rules.passes(win_all, aimed)  # wins every item: always passes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-4, 4, allow_nan=False), max_size=8))
def test_the_edits_that_pass_compete_by_their_gain_merge_order_among_equals(gains):
    indices = [3 * k for k in range(len(gains))]
    order = rules.ranked(indices, gains)
    assert sorted(order) == indices
    at = {i: g for i, g in zip(indices, gains, strict=True)}
    for a, b in zip(order, order[1:], strict=False):
        assert at[a] > at[b] or (at[a] == at[b] and a < b)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([0.0, 1.0])),
                max_size=8), st.lists(st.sampled_from(TYPES), unique=True, max_size=2))
def test_trying_the_first_failures_first_passes_the_same_edits_with_the_same_gains(outcomes, aimed):
    """edit_screen_early: an edit tried on one failure of each type first, and on the rest only while
    `may_pass` says it could still pass, passes exactly when it would on its whole minibatch; the edits that
    pass were tried on every item (the same gain), and the first round is made of decisive failures."""
    minibatch = [(f"i{k}", t, current) for k, (t, _, current) in enumerate(outcomes)]
    value = {f"i{k}": tried for k, (_, tried, _) in enumerate(outcomes)}
    first = rules.first_round(minibatch, aimed)
    assert first == [i for i, _, _ in minibatch if i in set(first)]  # a subsequence, in the minibatch's order
    of = {i: (t, current) for i, t, current in minibatch}
    assert all(of[i][1] < 1 and (not aimed or of[i][0] in aimed) for i in first)
    keys = [of[i][0] if aimed else "" for i in first]
    assert len(keys) == len(set(keys))  # one failure per type
    tried = [(of[i][0], value[i], of[i][1]) for i in first]
    left = [(t, current) for i, t, current in minibatch if i not in set(first)]
    whole = [(t, value[i], current) for i, t, current in minibatch]
    if rules.passes(whole, aimed):  # then it is never stopped, so it is tried on every item: the same gain
        assert rules.may_pass(tried, left, aimed)
    if not rules.may_pass(tried, left, aimed):  # stopped: no outcome of the items left would have let it pass
        for won in (0.0, 0.5, 1.0):
            assert not rules.passes([*tried, *((t, won, c) for t, c in left)], aimed)
