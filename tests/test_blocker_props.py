"""Properties of the blocker search's pure parts (`skillstate.skillopt.blockers`): the types a step aimed
at, the types it left failing, the order and units of the ablations, the edit that removes a line or a
clause, and which ablation names the blocker. The worlds are small deterministic models: a planted
blocker pins the stuck items at 0 while its line is there."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.log.values import Edit
from skillstate.skillopt import blockers as rules
from skillstate.skillopt import clauses
from skillstate.skillopt.editor import apply_edits

TYPES = ["a", "b", "c", "d"]
LINES = [f"- Rule number {n} says to check item kind {n}." for n in range(8)] + [
    "- Keep answers terse; never reformat anything.", "- Count carefully. Then answer in one word."]
edits_st = st.builds(lambda n: Edit(op="append", content=f"- edit {n}"), st.integers(0, 9))


@st.composite
def steps(draw):
    """Failure patches (their edits, the failures they were shown, their summary lines) and the kept edits."""
    patches = []
    for n in range(draw(st.integers(0, 5))):
        failures = [(f"p{n}-{k}", draw(st.sampled_from(TYPES))) for k in range(draw(st.integers(0, 8)))]
        named = draw(st.lists(st.sampled_from(TYPES), unique=True, max_size=2))
        summary = [f"{k + 1} failure(s) on {t} questions" for k, t in enumerate(named)]
        patches.append((draw(st.lists(edits_st, max_size=3)), failures, summary))
    kept = draw(st.lists(edits_st, max_size=4))
    return patches, kept


@settings(max_examples=120, deadline=None)
@given(steps(), st.randoms(use_true_random=False))
def test_an_edit_is_aimed_at_the_types_its_analysts_named_or_else_their_commonest_failures(step, rnd):
    patches, kept = step
    found = rules.aimed_items(patches, kept)
    keys = {(e.op, e.content) for e in kept}
    expected: dict[str, set[str]] = {}
    for edits, failures, summary in patches:
        if not any((e.op, e.content) in keys for e in edits):
            continue
        types = [t for _, t in failures]
        named = [t for t in TYPES if t in types and any(t in line for line in summary)]
        if not named and types:
            top = max(types.count(t) for t in types)
            named = [t for t in types if types.count(t) == top]
        for t in named:
            expected.setdefault(t, set()).update(i for i, u in failures if u == t)
    assert {t: set(ids) for t, ids in found.items()} == expected
    assert list(found) == sorted(found) and all(len(ids) == len(set(ids)) for ids in found.values())
    assert rules.aimed_types(patches, kept) == sorted(expected)
    shuffled = list(patches)
    rnd.shuffle(shuffled)
    assert rules.aimed_types(shuffled, list(reversed(kept))) == sorted(expected)  # no order matters
    assert rules.aimed_types(patches, []) == []


def test_a_type_is_named_by_its_words_in_any_case():
    assert rules.named_types(["3 failures on Date reasoning questions", "letter_counting twice"],
                             ["letter_counting", "date_reasoning", "arithmetic"]) == ["date_reasoning",
                                                                                      "letter_counting"]
    assert rules.named_types([], ["a"]) == []


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(TYPES), st.sampled_from([0.0, 0.2, 0.5, 0.8])),
       st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from([0.0, 1.0])), max_size=20))
def test_the_low_types_are_at_most_half_right_with_two_failures_lowest_first(by_type, outcomes):
    low = rules.low_types(by_type, outcomes)
    for t in low:
        assert by_type[t] <= rules.STUCK and sum(1 for u, v in outcomes if u == t and v < 1) >= 2
    for t in set(by_type) - set(low):
        assert by_type[t] > rules.STUCK or sum(1 for u, v in outcomes if u == t and v < 1) < 2
    assert [by_type[t] for t in low] == sorted(by_type[t] for t in low)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(TYPES), max_size=4),
       st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from([0.0, 0.5, 1.0])), max_size=20),
       st.randoms(use_true_random=False))
def test_a_stuck_type_was_aimed_at_and_still_fails_on_most_of_its_scored_items(aimed, outcomes, rnd):
    found = rules.stuck_types(aimed, outcomes)
    for t in found:
        vs = [v for u, v in outcomes if u == t]
        assert t in aimed and sum(1 for v in vs if v < 1) >= 2 and sum(vs) / len(vs) <= rules.STUCK
    for t in set(aimed) - set(found):
        vs = [v for u, v in outcomes if u == t]
        assert not vs or sum(1 for v in vs if v < 1) < 2 or sum(vs) / len(vs) > rules.STUCK
    shuffled = list(outcomes)
    rnd.shuffle(shuffled)
    assert rules.stuck_types(aimed, shuffled) == found
    fails = [sum(1 for u, v in outcomes if u == t and v < 1) for t in found]
    assert fails == sorted(fails, reverse=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.lists(st.sampled_from(TYPES), max_size=2, unique=True),
                          st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]), st.booleans()),
                max_size=8, unique_by=lambda t: t[0]),
       st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from([0.0, 0.5, 1.0])), max_size=20),
       st.lists(st.integers(0, 7), max_size=3))
def test_the_edit_put_back_was_screened_out_and_aimed_at_the_type_left_failing_most(tried, outcomes, kept):
    """blocker_screened: an edit the screen failed and the selection did not keep, aimed at the first type
    `stuck_types` gives among those such edits aimed at, with the largest gain for it (then the first)."""
    found = rules.screened_out(tried, outcomes, kept)
    out = [t for t in tried if not t[3] and t[0] not in kept]
    stuck = rules.stuck_types([x for t in out for x in t[1]], outcomes)
    if not stuck:
        assert found is None
        return
    assert found is not None
    index, task_type = found
    assert task_type == stuck[0]
    aimed = [t for t in out if task_type in t[1]]
    pick = next(t for t in aimed if t[0] == index)
    assert all(t[2] <= pick[2] for t in aimed)
    assert all(t[0] >= index for t in aimed if t[2] == pick[2])


@settings(max_examples=100, deadline=None)
@given(st.permutations(LINES), st.lists(st.floats(-1, 1), min_size=len(LINES), max_size=len(LINES)),
       st.integers(0, 3), st.integers(1, 10))
def test_the_lines_that_came_with_a_fall_of_the_type_are_ablated_first(lines, changes, n_initial, max_lines):
    lines = list(lines)
    initial, later = lines[:n_initial], lines[n_initial:]
    history = [(lines[: n_initial + k + 1], changes[k]) for k in range(len(later))]
    order = rules.suspicion(lines, initial, history)
    assert sorted(order) == list(range(len(lines)))
    change = {ln: (0.0 if ln in initial else changes[later.index(ln)]) for ln in lines}
    keys = [round(change[lines[i]], 9) for i in order]
    assert keys == sorted(keys)
    found = rules.units(lines, order, max_lines)
    assert [i for i, k in found if k is None] == order[:max_lines]
    for i in order[:max_lines]:
        parts = len(clauses.clauses(lines[i]))
        assert sorted(k for j, k in found if j == i and k is not None) == (list(range(parts)) if parts >= 2 else [])


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(LINES), st.lists(st.sampled_from(LINES), max_size=4, unique=True))
def test_the_removal_takes_out_the_line_or_only_its_clause(line, others):
    skill = "# Skill\n\n" + "\n".join([line, *[o for o in others if o != line]]) + "\n"
    text, report = apply_edits(skill, [rules.deletion(line, None)])
    assert line not in text.splitlines() and report[0].status == "applied"
    for o in others:
        assert o in text.splitlines() or o == line
    parts = clauses.clauses(line)
    for k in range(len(parts) if len(parts) >= 2 else 0):
        text, _ = apply_edits(skill, [rules.deletion(line, k)])
        kept = clauses.without(line, k)
        assert kept in text.splitlines() and line not in text.splitlines()  # the rest of the line stays
        assert len(clauses.clauses(kept)) == len(parts) - 1


@st.composite
def searches(draw):
    """Lines (some of two clauses), a planted blocker (a line, or one of its clauses) or none, the stuck items,
    and the outcome of removing each unit: every item recovers without the blocker, noise elsewhere."""
    n_lines = draw(st.integers(1, 8))
    lines = [LINES[i] for i in draw(st.lists(st.integers(0, len(LINES) - 1), min_size=n_lines, max_size=n_lines,
                                              unique=True))]
    found_units = rules.units(lines, list(range(len(lines))), len(lines))
    items = draw(st.integers(1, 8))
    planted = draw(st.one_of(st.none(), st.sampled_from(found_units)))
    noise = draw(st.lists(st.integers(0, 1), min_size=len(found_units) * items, max_size=len(found_units) * items))
    return lines, found_units, items, planted, noise


def _outcomes(found_units, items, planted, noise, quiet: bool) -> list[list[float]]:
    out = []
    for u, unit in enumerate(found_units):
        hit = planted is not None and (unit == planted or (planted[1] is not None and unit == (planted[0], None)))
        out.append([1.0 if hit else (0.0 if quiet else float(noise[u * items + k])) for k in range(items)])
    return out


@settings(max_examples=150, deadline=None)
@given(searches())
def test_a_planted_blocker_is_named_when_nothing_else_lifts_and_nothing_is_named_without_one(search):
    _lines, found_units, items, planted, noise = search
    candidate = [0.0] * items
    lifts = [rules.lift(o, candidate) for o in _outcomes(found_units, items, planted, noise, quiet=True)]
    chosen = rules.verdict(lifts, found_units, items)
    if planted is None:
        assert chosen is None
    else:
        assert chosen is not None and found_units[chosen][0] == planted[0]
        assert found_units[chosen] == planted  # a clause that explains it all is taken over its whole line


@settings(max_examples=150, deadline=None)
@given(searches(), st.randoms(use_true_random=False))
def test_a_named_blocker_stands_out_and_the_verdict_is_the_same_in_any_order_of_summing(search, rnd):
    _lines, found_units, items, planted, noise = search
    candidate = [0.0] * items
    outcomes = _outcomes(found_units, items, planted, noise, quiet=False)
    lifts = [rules.lift(o, candidate) for o in outcomes]
    chosen = rules.verdict(lifts, found_units, items)
    shuffled = []
    for o in outcomes:
        pairs = list(zip(o, candidate, strict=True))
        rnd.shuffle(pairs)
        shuffled.append(rules.lift([a for a, _ in pairs], [c for _, c in pairs]))
    assert rules.verdict(shuffled, found_units, items) == chosen
    if chosen is None:
        return
    line = found_units[chosen][0]
    best = {i: max(lift for (j, _), lift in zip(found_units, lifts, strict=True) if j == i) for i, _ in found_units}
    assert 2 * best[line] >= items
    assert all(best[line] - b >= max(1.0, items / 3) for i, b in best.items() if i != line)


def test_the_search_on_no_items_or_no_lines_names_nothing():
    assert rules.verdict([], [], 3) is None
    assert rules.verdict([3.0], [(0, None)], 0) is None
    assert rules.stuck_items([("x", "a", 0.0), ("y", "b", 0.0), ("z", "a", 1.0), ("w", "a", 0.0)], "a", 5) == \
        ["x", "w"]
    random.seed(0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([0.0, 0.25, 1.0])), min_size=1,
                max_size=8), st.data())
def test_an_ablation_is_stopped_only_when_no_rest_of_its_outcomes_could_lift_half_the_items(pairs, data):
    ablated, candidate = [a for a, _ in pairs], [c for _, c in pairs]
    done = data.draw(st.integers(0, len(pairs)))
    rest = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=len(pairs) - done,
                              max_size=len(pairs) - done))
    finished = ablated[:done] + rest
    if not rules.may_stand_out(ablated[:done], candidate):  # stopped: however it would have gone on ...
        assert 2 * rules.lift(finished, candidate) < len(pairs)  # ... it could not have been named
    if 2 * round(rules.lift(finished, candidate), 9) >= len(pairs):  # one that could be named is never stopped
        assert all(rules.may_stand_out(finished[:k], candidate) for k in range(len(pairs) + 1))


@settings(max_examples=150, deadline=None)
@given(searches())
def test_stopping_ablations_early_names_the_blocker_the_full_search_names(search):
    """On failed stuck items (value 0), the ablations rolled out item by item and stopped as
    `blocker_ablation: group` stops them (`rules.live`, by line): whatever the full search names, the stopped
    one names too, clause or whole line, and the named line's ablations were all rolled out in full."""
    _lines, found_units, items, planted, noise = search
    candidate = [0.0] * items
    full = _outcomes(found_units, items, planted, noise, quiet=False)
    lines = [line for line, _ in found_units]
    going, k = list(range(len(full))), 0
    rolled = [0] * len(full)
    while going and k < items:
        k += 1
        for u in going:
            rolled[u] = k
        still = set(rules.live([o[:rolled[u]] for u, o in enumerate(full)], candidate, lines))
        going = [u for u in going if u in still]
    stopped = [o[:rolled[u]] for u, o in enumerate(full)]
    named = rules.verdict([rules.lift(o, candidate) for o in full], found_units, items)
    lifts = [rules.lift(o, candidate[:len(o)]) for o in stopped]
    if named is not None:
        assert rules.verdict(lifts, found_units, items) == named
        assert all(len(stopped[u]) == items for u, line in enumerate(lines) if line == lines[named])


def test_a_clause_that_lifts_less_than_half_still_competes_with_its_line():
    """The clause chosen over its line needs only half the line's lift, less than half the items: stopped on
    its own it would lose to the whole line (how runs logged before `blocker_stop_by_line` stopped it)."""
    candidate = [0.0] * 5
    whole, clause_a, clause_b = [1.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 1.0]
    units = [(0, None), (0, 0), (0, 1)]
    full = [rules.lift(o, candidate) for o in (whole, clause_a, clause_b)]
    assert rules.verdict(full, units, 5) == 2  # the full search keeps the line and drops its clause 1
    early = [whole[:3], clause_a[:3], clause_b[:3]]
    assert rules.live(early, candidate, None) == [0]  # each on its own: the clauses stop, the whole goes on
    assert rules.live(early, candidate, [0, 0, 0]) == [0, 1, 2]  # by line: all three go on with the whole


def test_the_group_holds_the_lines_of_one_clause_and_lifts_at_half_the_items():
    lines = [LINES[0], LINES[8], LINES[1]]  # LINES[8] joins two clauses
    found_units = rules.units(lines, [0, 1, 2], 3)
    assert rules.single_clause_lines(lines, found_units) == [0, 2]
    assert rules.single_clause_lines(lines, rules.units(lines, [2, 1, 0], 1)) == [2]
    assert rules.group_lifts(3.0, 6) and not rules.group_lifts(2.9, 6) and not rules.group_lifts(0.0, 0)
