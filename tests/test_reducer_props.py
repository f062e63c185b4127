"""Reducer properties on real sim-run logs: any prefix folds to the engine's
state at that point; a fork replays like its parent up to the fork step."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skillstate.engine.runner import lineage_events, state_of, step_boundary
from skillstate.log.reducer import RunState, fold, reduce
from skillstate.trainer import Trainer


def test_engine_state_is_the_fold_of_its_log(finished_run):
    store, result, rec = finished_run
    stored = lineage_events(store, result.run_id)
    assert state_of(stored) == result.state
    assert len(rec.items) == len(stored) - 1  # every event but RunStarted was reported by the engine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_folding_any_prefix_equals_the_engines_state_there(finished_run, data):
    store, result, rec = finished_run
    stored = lineage_events(store, result.run_id)
    k = data.draw(st.integers(min_value=1, max_value=len(rec.items)))
    # rec.items[k-1] is the engine's state right after event k+1 (event 1 is RunStarted)
    event, engine_state, record = rec.items[k - 1]
    assert record.seq == k + 1
    assert state_of(stored[: k + 1]) == engine_state


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reduce_never_mutates_its_input(finished_run, data):
    store, result, _ = finished_run
    events = [s.event for s in lineage_events(store, result.run_id)]
    k = data.draw(st.integers(min_value=0, max_value=len(events) - 1))
    before = fold(events[:k])
    after = reduce(before, events[k])
    assert before == fold(events[:k])  # the input state is as it was
    assert after != before


def test_fold_of_nothing_is_the_empty_state():
    assert fold([]) == RunState()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(min_value=0, max_value=6))
def test_replaying_a_fork_equals_replaying_its_parent_up_to_the_fork_step(finished_run, step):
    store, result, _ = finished_run
    child = Trainer(store=store, run_id=result.run_id).fork(step, {"lr_scheduler": "linear"})
    parent_events = lineage_events(store, result.run_id)
    fork_events = lineage_events(store, child.run_id)
    cut = step_boundary(parent_events, step)
    assert fork_events[:cut] == parent_events[:cut]
    assert state_of(fork_events[:cut]) == state_of(parent_events[:cut])
    assert step_boundary(fork_events, step) == cut
