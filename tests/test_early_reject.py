"""The exact early-reject gate: a candidate stops being scored once it cannot
beat the current score, and the decision is always the one a full
evaluation gives."""

from __future__ import annotations

import pytest
from conftest import examples, slow_case, small_config
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.engine.runner import lineage_events
from skillstate.engine.scoring import failed_outcomes, send_limit
from skillstate.log.values import ItemResult
from skillstate.reading.audit import audit, verify
from skillstate.skillopt import gate
from skillstate.trainer import Trainer

score = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1, allow_nan=False))
outcome = st.tuples(st.sampled_from([0.0, 1.0]), score)  # (hard, soft): hard is 0 or 1 in every env here


@st.composite
def cases(draw):
    outcomes = draw(st.lists(outcome, min_size=1, max_size=40))
    order = draw(st.permutations(range(len(outcomes))))
    metric = draw(st.sampled_from(["hard", "soft", "mixed"]))
    weight = draw(st.floats(0, 1, allow_nan=False))
    density = draw(st.floats(0, 1, allow_nan=False))
    density_weight = draw(st.sampled_from([0.0, 0.0, 0.1, 0.5]))
    current = draw(st.one_of(st.floats(0, 1.5, allow_nan=False),
                             st.sampled_from([k / len(outcomes) for k in range(len(outcomes) + 1)])))
    return outcomes, order, metric, weight, density, density_weight, current


def full_gate(outcomes, metric, weight, density, density_weight) -> float:
    """What a full evaluation computes (scoring.summarize): means in split order."""
    n = len(outcomes)
    hard = sum(h for h, _ in outcomes) / n
    soft = sum(s for _, s in outcomes) / n
    return gate.with_density(gate.gate_score(hard, soft, metric, weight), density, density_weight)


@examples(full=1500, sampled=300)
def test_an_early_reject_is_always_the_decision_a_full_evaluation_gives(max_examples):
    @given(cases())
    @settings(max_examples=max_examples, deadline=None)
    def check(case):
        outcomes, order, metric, weight, density, density_weight, current = case
        ordered = [outcomes[i] for i in order]
        found = gate.early_reject_point(ordered, len(outcomes), current, metric, weight, density, density_weight)
        full = full_gate(outcomes, metric, weight, density, density_weight)
        if found is not None:
            k, bound = found
            assert 1 <= k < len(outcomes)
            assert full <= bound + gate.ROUNDING_SLACK
            assert gate.decide(full, current, max(current, full)) == gate.REJECT
            # the fewest items: no shorter prefix proves it
            assert gate.early_reject_point(ordered[: k - 1], len(outcomes), current, metric, weight, density,
                                           density_weight) is None or k == 1

    check()


@examples(full=1500, sampled=300)
def test_the_prefix_test_finds_the_same_point_as_the_whole_scan(max_examples):
    @given(cases(), st.sampled_from([0.0, 0.0, 0.05]))
    @settings(max_examples=max_examples, deadline=None)
    def check(case, cost):
        # gate.reject_after tests one prefix; extended an item at a time, it first proves a reject at the point
        # early_reject_point finds, with the same bound (bit for bit), and never where it finds none
        outcomes, order, metric, weight, density, density_weight, current = case
        ordered = [outcomes[i] for i in order]
        n = len(ordered)
        found = gate.early_reject_point(ordered, n, current, metric, weight, density, density_weight, cost)
        first = next((hit for k in range(n + 1)
                      if (hit := gate.reject_after(ordered[:k], n, current, metric, weight, density, density_weight,
                                                   cost)) is not None), None)
        assert first == found

    check()


@examples(full=800, sampled=160)
def test_items_go_out_no_further_than_the_reject_can_come(max_examples):
    @given(cases(), st.integers(1, 8))
    @settings(max_examples=max_examples, deadline=None)
    def check(case, width):
        # scoring.send_limit: from any scored prefix, the items it lets out all lie inside the prefix that proves the
        # reject, so none of them goes unused; and it lets at least one out, so the evaluation always moves on
        outcomes, order, metric, weight, density, density_weight, current = case
        ordered = [outcomes[i] for i in order]
        n = len(ordered)
        items = [{"id": f"i{i}", "task_type": "t"} for i in range(n)]
        results = [ItemResult(item_id=f"i{i}", task_type="t", hard=h, soft=s) for i, (h, s) in enumerate(ordered)]

        def check(prefix):  # the engine's (scoring.reject_check)
            return gate.reject_after([(r.hard, r.soft) for r in prefix], n, current, metric, weight, density,
                                     density_weight)

        found = gate.early_reject_point(ordered, n, current, metric, weight, density, density_weight)
        stop = found[0] if found is not None else n
        for done in range(stop):
            reach = send_limit(check, failed_outcomes(items), results[:done], width)
            assert 1 <= reach <= width
            assert done + reach <= stop or found is None

    check()


@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=30), st.integers(0, 30))
@settings(max_examples=500, deadline=None)
def test_with_the_hard_metric_a_tie_is_rejected_as_soon_as_it_is_certain(hards, wins):
    n = len(hards)
    current = min(wins, n) / n
    found = gate.early_reject_point([(h, h) for h in hards], n, current, "hard", 0.5, 0.0, 0.0)
    fails = [i for i, h in enumerate(hards) if h == 0]
    needed = n - min(wins, n)  # failures that make the candidate unable to beat `current`
    if needed == 0:
        assert found is not None and found[0] == 1 or n == 1
    elif len(fails) >= needed and fails[needed - 1] < n - 1:
        assert found is not None and found[0] == fails[needed - 1] + 1
    else:
        assert found is None


@pytest.mark.parametrize("seed", [42, slow_case(7), slow_case(2024)])  # a sample by default, all when slow
def test_decisions_are_identical_with_early_reject_on_and_off(tmp_path, seed):
    # The step buffer shows a rejected step's score after; an early reject knows only its bound, so with the
    # buffer on, later prompts (and so later proposals) differ. With it off, the runs must be the same.
    def run(on: bool):
        # repair off: a candidate the repair may examine is scored in full (the test below covers it)
        cfg = small_config(seed=seed, early_reject=on, use_step_buffer=False, repair="off")
        return Trainer(cfg, db=f"sqlite:///{tmp_path / f'{seed}-{on}.db'}", run_id="r").train()

    on, off = run(True), run(False)
    decisions = lambda r: [(s.event.step, s.event.decision) for s in lineage_events(r.store, "r")  # noqa: E731
                           if s.type == "GateDecided"]
    assert decisions(on) == decisions(off)
    for key in ("best_score", "best_step", "accepts", "rejects", "test"):
        assert on.summary[key] == off.summary[key]
    events = [s.event for s in lineage_events(on.store, "r")]
    partial = [e for e in events if e.type == "CandidateEvaluated" and e.partial]
    assert partial, "no candidate was rejected early"
    gates = {e.step: e for e in events if e.type == "GateDecided"}
    for ev in partial:
        assert ev.scores.n == ev.partial.scored == len(ev.partial.item_ids) < ev.partial.of
        decided = gates[ev.step]  # the recorded bound is what proved the reject
        assert decided.decision == "reject" and decided.candidate_score == ev.partial.upper_bound
        assert ev.partial.upper_bound <= decided.current_score
    assert on.summary["usage"]["target"]["calls"] < off.summary["usage"]["target"]["calls"]
    assert audit(on.store, "r").ok
    report = verify(on.store, "r")
    assert report.ok and report.checked == report.total


# by default seed 7 (both slow updates rejected early) and 2024 (neither); the slow suite all four
@pytest.mark.parametrize("seeds", [pytest.param((7, 2024), id="sample"), slow_case((42, 7, 2024, 11), id="all")])
def test_a_gated_slow_update_is_rejected_early_with_the_decision_a_full_evaluation_gives(tmp_path, seeds):
    # Seeds where the slow-updated skill loses: its evaluation stops early, the decision stays the same.
    cfg = dict(num_epochs=3, batch_size=60, use_slow_update=True, slow_update_gate=True, use_meta_skill=False,
               use_step_buffer=False)
    found = 0
    for seed in seeds:
        runs = {}
        for on in (True, False):
            runs[on] = Trainer(small_config(seed=seed, early_reject_slow_update=on, **cfg),
                               db=f"sqlite:///{tmp_path / f'su-{seed}-{on}.db'}", run_id="r").train()
        decided = {on: [s.event for s in lineage_events(r.store, "r") if s.type == "SlowUpdateDecided"]
                   for on, r in runs.items()}
        assert [d.decision for d in decided[True]] == [d.decision for d in decided[False]]
        for key in ("best_score", "best_step", "accepts", "rejects", "test"):
            assert runs[True].summary[key] == runs[False].summary[key]
        for early, full in zip(decided[True], decided[False], strict=True):
            if early.partial is None:
                assert early.candidate_score == full.candidate_score
                continue
            found += 1
            assert early.scores.n == early.partial.scored < early.partial.of
            assert full.candidate_score <= early.candidate_score == early.partial.upper_bound <= early.current_score
            assert "rejected early" in early.reason
        assert audit(runs[True].store, "r").ok
        report = verify(runs[True].store, "r")
        assert report.ok and report.checked == report.total
    assert found, "no slow update was rejected early"


@pytest.mark.parametrize("seed", [12, 3])
def test_with_the_repair_on_a_noisy_target_early_reject_changes_no_decision(tmp_path, seed):
    # The repair pairs the candidate's per-item outcomes with the current skill's: it must see the same items
    # whether early reject is on or off (repair_full_evaluation, with repair_prefix off, scores such a candidate
    # fully). Seed 12 gave other decisions before that.
    def run(on: bool):
        cfg = small_config(seed=seed, early_reject=on, use_step_buffer=False, sim={"noise": "moderate"},
                           repair_prefix=False)
        assert cfg.repair == "ablate" and cfg.repair_full_evaluation
        return Trainer(cfg, db=f"sqlite:///{tmp_path / f'{seed}-{on}.db'}", run_id="r").train()

    on, off = run(True), run(False)
    decisions = lambda r: [(s.event.step, s.event.decision, s.event.reason)  # noqa: E731
                           for s in lineage_events(r.store, "r") if s.type == "GateDecided"]
    assert decisions(on) == decisions(off)
    events = [s.event for s in lineage_events(on.store, "r")]
    assert any(e.type == "EditsAblated" and e.ablations for e in events), "the repair never ran"
    repaired_steps = {e.step for e in events if e.type == "EditsAblated"}
    for e in events:  # a candidate the repair examined was scored in full
        if e.type == "CandidateEvaluated" and e.step in repaired_steps and e.partial is not None:
            ablated = next(x for x in events if x.type == "EditsAblated" and x.step == e.step)
            assert e.skill != ablated.candidate_skill  # only the repaired candidate may stop early


@pytest.mark.parametrize("seed,order", [(12, "failed_first"), slow_case(3, "failed_first"), (5, "hardness"),
                                        slow_case(7, "hardness")])  # one seed of each order by default
def test_with_the_repair_pairing_early_rejects_prefix_early_reject_changes_no_decision(tmp_path, seed, order):
    # repair_prefix: early reject applies to the candidates the repair examines, and the repair pairs the items
    # early reject scores, computed the same way from a full evaluation: the same repairs and decisions either way;
    # under eval_order hardness too (its counts come only from skills made current, whose results both runs hold)
    def run(on: bool):
        cfg = small_config(seed=seed, early_reject=on, use_step_buffer=False, sim={"noise": "moderate"},
                           eval_order=order)
        assert cfg.repair_prefix  # the default
        return Trainer(cfg, db=f"sqlite:///{tmp_path / f'{seed}-{on}.db'}", run_id="r").train()

    on, off = run(True), run(False)
    events = lambda r: [s.event for s in lineage_events(r.store, "r")]  # noqa: E731
    decisions = lambda r: [(e.step, e.decision) for e in events(r) if e.type == "GateDecided"]  # noqa: E731
    repairs = lambda r: [(e.step, e.item_ids, e.dropped, e.skill) for e in events(r)  # noqa: E731
                         if e.type == "EditsAblated"]
    assert decisions(on) == decisions(off)
    assert repairs(on) == repairs(off)
    examined = {e.step: e for e in events(on) if e.type == "EditsAblated"}
    stopped = [e for e in events(on) if e.type == "CandidateEvaluated" and e.partial is not None
               and e.step in examined and e.skill == examined[e.step].candidate_skill]
    assert stopped, "no candidate the repair examined was rejected early"
    for e in stopped:  # the repair paired exactly the prefix early reject scored
        paired = set(examined[e.step].item_ids)
        assert paired <= set(e.partial.item_ids)
    assert on.summary["usage"]["target"]["calls"] < off.summary["usage"]["target"]["calls"]
    report = verify(on.store, "r")
    assert report.ok and report.checked == report.total
