"""Property tests of the review's pure parts (issue 43): rebuilding a candidate without some edits is
deterministic and is the base patched with the edits kept; which steps wait for a person; and the gate
decision a decision implies always folds (the review fold's rules hold for what the engine records)."""

from __future__ import annotations

from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.config import SkillConfig
from skillstate.engine.review import file_diffs, rebuild
from skillstate.engine.update import patch_skill
from skillstate.log.events import Edit, GateDecided, Scores
from skillstate.log.events_review import GateVerdict, ReviewDecided, ReviewEdit, ReviewRequested
from skillstate.log.review_fold import ACCEPTED, ReviewFoldError, check_gate, decision_problem
from skillstate.log.state import StepProgress
from skillstate.skillopt import review as rules

WORDS = st.sampled_from(["Keep answers short.", "Count letters one by one.", "Days repeat every 7 days.",
                         "Think first.", "Answer with a number.", "Use the metric system.", "Be brief."])
LINES = st.lists(WORDS.map(lambda w: f"- {w}"), min_size=1, max_size=6)


@st.composite
def skill_and_edits(draw):
    lines = draw(LINES)
    base = "# Skill\n\n## Rules\n" + "\n".join(lines) + "\n"
    edits = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        op = draw(st.sampled_from(["append", "insert_after", "replace", "delete"]))
        target = draw(st.sampled_from([*lines, "## Rules", "- absent line"])) if op != "append" else ""
        content = "" if op == "delete" else f"- {draw(WORDS)}"
        edits.append(Edit(op=op, target=target, content=content))
    dropped = sorted(draw(st.sets(st.integers(min_value=0, max_value=len(edits) - 1))))
    return base, edits, dropped


def request_of(base: str, edits: list[Edit], verdict: str = "accept") -> ReviewRequested:
    scores = Scores(hard=0.5, soft=0.5, gate=0.5, n=10)
    return ReviewRequested(step=1, review="accepted", base_skill="b" * 64, candidate="c" * 64, diff="d" * 64,
                           verdict=GateVerdict(decision=verdict, candidate_score=0.6, current_score=0.5,
                                               best_score=0.55, reason="r"),
                           split="val", scores=scores,
                           edits=[ReviewEdit(edit=e, origin="selected", index=i) for i, e in enumerate(edits)],
                           droppable=True)


CONFIG = SkillConfig()


@settings(max_examples=150, deadline=None)
@given(case=skill_and_edits())
def test_rebuilding_without_some_edits_is_deterministic_and_patches_the_kept_ones(case):
    base, edits, dropped = case
    req = request_of(base, edits)
    once, twice = rebuild(CONFIG, base, req, dropped), rebuild(CONFIG, base, req, dropped)
    assert once == twice
    kept = [e for i, e in enumerate(edits) if i not in set(dropped)]
    assert once[0] == patch_skill(base, kept)[0]
    assert rebuild(CONFIG, base, req, [])[0] == patch_skill(base, edits)[0]  # nothing dropped: the candidate
    assert rules.kept(edits, dropped) == kept


@given(items=st.lists(st.integers(), max_size=8), data=st.data())
def test_kept_leaves_out_exactly_the_dropped_indices_in_order(items, data):
    dropped = data.draw(st.lists(st.integers(min_value=0, max_value=max(0, len(items) - 1)), max_size=4)) \
        if items else []
    out = rules.kept(items, dropped)
    assert out == [x for i, x in enumerate(items) if i not in set(dropped)]
    assert len(out) == len(items) - len(set(dropped))


@given(mode=st.sampled_from(rules.MODES), decision=st.sampled_from(["accept", "accept_best", "reject", "skip"]),
       changed=st.booleans())
def test_which_steps_wait_for_a_person(mode, decision, changed):
    waits = rules.under_review(mode, decision, changed)
    if mode == "off" or not changed or decision == "skip":
        assert not waits
    elif mode == "all":
        assert waits
    elif mode == "new_best":
        assert waits == (decision == "accept_best")
    else:
        assert waits == (decision in ACCEPTED)


@st.composite
def decisions(draw):
    n = draw(st.integers(min_value=1, max_value=5))
    verdict = draw(st.sampled_from(["accept", "accept_best", "reject"]))
    decision = draw(st.sampled_from(["approve", "reject"]))
    dropped = sorted(draw(st.sets(st.integers(min_value=0, max_value=n - 1), max_size=n)))
    req = request_of("base", [Edit(op="append", content=f"- line {i}") for i in range(n)], verdict)
    who = draw(st.sampled_from(["alice", "timeout"]))
    comment = draw(st.sampled_from(["", "too broad"]))
    return req, ReviewDecided(step=1, candidate=req.candidate, decision=decision, dropped=dropped, reviewer=who,
                              at="2026-01-01T00:00:00+00:00", comment=comment)


@examples(full=200, sampled=40)
def test_the_gate_decision_a_review_implies_always_folds(max_examples):
    @given(case=decisions(), score=st.floats(min_value=0, max_value=1))
    @settings(max_examples=max_examples)
    def check(case, score):
        req, decided = case
        problem = decision_problem(req, decided)
        if decided.dropped and (decided.decision != "approve" or req.verdict.decision not in ACCEPTED
                                or len(decided.dropped) == len(req.edits)):
            assert problem is not None  # the fold refuses it (and so does the desk, before appending)
            return
        assert problem is None
        kept = rules.kept_candidate(req.verdict, decided)
        rebuilt = score if kept and decided.dropped else None
        fields = rules.closing(req.verdict, decided, rebuilt)
        gate = GateDecided(step=1, **fields)
        assert (gate.decision in ACCEPTED) == kept
        if rebuilt is not None:
            assert gate.candidate_score == score and gate.decision == ("accept_best" if score > 0.55 else "accept")
            assert gate.forced == (score <= 0.5)
        elif not kept:
            assert gate.decision == "reject" and gate.candidate_score == req.verdict.candidate_score
        else:
            assert fields == {**req.verdict.model_dump(), "reason": fields["reason"]}
        assert ("by timeout (review_default)" in gate.reason) == (decided.reviewer == "timeout")
        progress = StepProgress(step=1, epoch=1, batch_item_ids=(), edit_budget=1, base_skill="b", review=req,
                                review_decision=decided, review_rebuilt=rebuilt is not None)
        if rebuilt is None:
            check_gate(progress, gate)  # raises if the fold would refuse it
        flipped = gate.model_copy(update={"decision": "reject" if kept else "accept"})
        try:
            check_gate(progress, flipped)
            raise AssertionError("the fold took a gate decision its review does not imply")
        except ReviewFoldError:
            pass

    check()


@given(case=skill_and_edits())
def test_the_diff_names_only_files_that_changed(case):
    base, edits, _ = case
    cand = patch_skill(base, edits)[0]
    diffs = file_diffs(base, cand, "skill")
    assert (diffs == []) == (cand == base)
    for d in diffs:
        assert d["path"] == "skill" and d["diff"].startswith("--- current/skill")
