"""Parent selection (`parent_selection: pareto`), its pure parts: the front
and the seeded draw (skillstate.skillopt.pareto)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from skillstate.skillopt.pareto import dominates, draw, front

TYPES = ["arithmetic", "dates", "letters", "reading"]
score = st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.8, 1.0])
profile = st.fixed_dictionaries({t: score for t in TYPES})
pools = st.lists(st.tuples(st.sampled_from([f"s{i}" for i in range(8)]), profile), min_size=1, max_size=8)


def unique(pool):
    seen: dict = {}
    for skill, scores in pool:
        seen.setdefault(skill, scores)
    return seen


@given(pools)
def test_every_type_is_led_by_a_member_of_the_front(pool):
    members, skills = front(pool), unique(pool)
    for t in TYPES:
        top = max(s[t] for s in skills.values())
        assert any(t in types and skills[m][t] == top for m, types in members.items())


@given(pools)
def test_no_member_of_the_front_is_dominated_and_each_leads_what_it_says(pool):
    members, skills = front(pool), unique(pool)
    assert members
    for m, types in members.items():
        assert not any(dominates(skills[o], skills[m], TYPES) for o in skills if o != m)
        assert types == sorted(types)
        assert all(skills[m][t] == max(s[t] for s in skills.values()) for t in types)


@given(pools, st.integers(0, 2**31), st.integers(1, 500))
def test_the_draw_is_a_member_and_a_function_of_seed_and_step(pool, seed, step):
    members = front(pool)
    chosen = draw(members, seed, step)
    assert chosen in members
    assert draw(dict(members), seed, step) == chosen


def test_a_skill_that_leads_every_type_alone_is_always_drawn():
    pool = [("base", {"a": 0.2, "b": 0.5}), ("mid", {"a": 0.5, "b": 0.5}), ("top", {"a": 0.8, "b": 0.9})]
    assert front(pool) == {"top": ["a", "b"]}
    assert {draw(front(pool), 7, step) for step in range(1, 50)} == {"top"}


def test_a_skill_that_lost_a_type_keeps_the_one_that_held_it_on_the_front():
    # the later skill lifts letters but breaks dates (a rule that helps one type and breaks another)
    pool = [("before", {"dates": 0.8, "letters": 0.2, "sums": 0.6}),
            ("after", {"dates": 0.1, "letters": 0.9, "sums": 0.6})]
    assert front(pool) == {"before": ["dates", "sums"], "after": ["letters", "sums"]}
    drawn = [draw(front(pool), 3, step) for step in range(1, 201)]
    assert 60 <= drawn.count("before") <= 140  # weights 2 and 2: about half each


def test_the_draw_follows_the_weights():
    members = {"a": ["t1", "t2", "t3"], "b": ["t4"]}
    drawn = [draw(members, 11, step) for step in range(1, 2001)]
    assert 1350 <= drawn.count("a") <= 1650  # weight 3 of 4


def test_equal_profiles_are_both_on_the_front():
    pool = [("x", {"a": 0.5}), ("y", {"a": 0.5}), ("x", {"a": 0.0})]  # a repeated skill counts once, first listing
    assert front(pool) == {"x": ["a"], "y": ["a"]}


# --- the screen of edits rejected before (drop_rejected_edits) ------------------

edit_texts = st.sampled_from(["- Keep answers short.", "- Count twice.", "- keep answers  SHORT.", "- Be exact."])


@given(st.lists(edit_texts, min_size=1, max_size=6), st.dictionaries(edit_texts, st.integers(0, 3)),
       st.integers(0, 3))
def test_the_screen_drops_exactly_the_edits_rejected_often_enough(contents, counts, n):
    from skillstate.log.events import Edit
    from skillstate.skillopt.screen import edit_key, screen_edits

    edits = [Edit(op="append", content=c) for c in contents]
    rejected: dict = {}
    for text, k in counts.items():  # keys normalize: case, spaces and the list marker do not matter
        key = edit_key(Edit(op="append", content=text))
        rejected[key] = max(rejected.get(key, 0), k)
    kept, dropped = screen_edits("# Skill\n", "", edits, rejected, n)
    plain_kept, _ = screen_edits("# Skill\n", "", edits)
    reasons = {d.index: d.reason for d in dropped}
    for i, edit in enumerate(edits):
        again = n > 0 and rejected.get(edit_key(edit), 0) >= n
        if again and i in plain_kept:
            assert reasons[i] == "rejected_before"
        if i in kept:
            assert not again
    if n == 0:  # off: the same as without the counts
        assert kept == plain_kept
