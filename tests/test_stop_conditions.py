"""Stop conditions: no improvement for N steps, a target score, a wall-time
limit and a stop file. Each stops cleanly at an event boundary, is recorded
as a StopConditionMet event, and resumes to exactly the events an
uninterrupted run writes once the condition is relaxed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import small_config

from skillstate.cli.main import cli
from skillstate.config import SkillConfig
from skillstate.engine.runner import lineage_events
from skillstate.engine.stops import StopConditions
from skillstate.log.event_codec import encode
from skillstate.log.state import RunState
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import canonical_json


def _payloads(store: Store, run_id: str) -> list[str]:
    """Every event after RunStarted (whose config holds the run's own stop settings), stops left out."""
    return [canonical_json([s.type, encode(s.event)]) for s in lineage_events(store, run_id)[1:]
            if s.type != "StopConditionMet"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('stops') / 'full.db'}")
    Trainer(small_config(), store=store, run_id="full").train()
    return _payloads(store, "full")


def _stops(store: Store, run_id: str):
    return [s.event for s in lineage_events(store, run_id) if s.type == "StopConditionMet"]


def _resumed_equals_uninterrupted(store: Store, run_id: str, uninterrupted: list[str], **relaxed) -> None:
    result = Trainer(small_config(**relaxed), store=store, run_id=run_id).train()
    assert result.state.completed and result.state.stopped is None
    assert _payloads(store, run_id) == uninterrupted
    assert audit(store, run_id).ok
    report = verify(store, run_id)
    assert report.ok and report.checked == report.total


def test_no_improvement_stops_and_resumes_to_the_uninterrupted_run(tmp_path, uninterrupted):
    store = Store(f"sqlite:///{tmp_path / 'n.db'}")
    result = Trainer(small_config(stop_after_no_improvement=1), store=store, run_id="n").train()
    state = result.state
    assert not state.completed and state.stopped is not None
    assert state.stopped.condition == "no_improvement" and state.stopped.step == state.last_completed_step
    assert state.last_completed_step - state.best_step == 1 and state.progress is None
    assert result.summary["status"].startswith("stopped at step")
    # resumed under the same condition: nothing is added
    again = Trainer(small_config(stop_after_no_improvement=1), store=store, run_id="n").train()
    assert len(_stops(store, "n")) == 1 and again.state.stopped == state.stopped
    assert verify(store, "n").ok  # a stopped log verifies as it is
    _resumed_equals_uninterrupted(store, "n", uninterrupted)


def test_target_score_stops_before_the_next_step(tmp_path, uninterrupted):
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    state = Trainer(small_config(target_score=0.5), store=store, run_id="t").train().state
    assert state.stopped is not None and state.stopped.condition == "target_score"
    assert state.best_score >= 0.5 and state.last_completed_step < state.total_steps
    before = [rec.best_score for rec in state.history[:-1]]
    assert all(score < 0.5 for score in before)  # it stopped at the first step boundary past the target
    _resumed_equals_uninterrupted(store, "t", uninterrupted)


def test_a_stop_file_stops_at_the_next_event_boundary(tmp_path, uninterrupted):
    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    stop_file = tmp_path / "STOP"

    def touch_after_first_rollout(progress) -> None:
        if progress.event is not None and progress.event.type == "RolloutCompleted":
            stop_file.touch()

    state = Trainer(small_config(stop_file=str(stop_file)), store=store, run_id="f",
                    on_progress=touch_after_first_rollout).train().state
    assert state.stopped is not None and state.stopped.condition == "stop_file"
    assert state.progress is not None and state.progress.rollout is not None  # mid-step, right after the rollout
    assert str(stop_file) in state.stopped.reason
    stop_file.unlink()
    _resumed_equals_uninterrupted(store, "f", uninterrupted, stop_file=str(stop_file))


def test_a_wall_time_limit_stops_and_resumes(tmp_path, uninterrupted):
    store = Store(f"sqlite:///{tmp_path / 'w.db'}")
    state = Trainer(small_config(max_wall_seconds=0.2), store=store, run_id="w").train().state
    assert state.stopped is not None and state.stopped.condition == "wall_time"
    assert not state.completed
    _resumed_equals_uninterrupted(store, "w", uninterrupted)


def test_the_wall_clock_and_the_score_conditions_are_checked_where_the_docs_say():
    now = [0.0]
    stops = StopConditions(SkillConfig(max_wall_seconds=10, target_score=0.5), clock=lambda: now[0])
    state = RunState(config={"x": 1}, best_score=0.6, best_step=1)
    assert stops(state, "rollout") is None  # the target is checked only before a step
    assert stops(state, "start_step").condition == "target_score"
    now[0] = 10.0
    assert stops(state, "rollout").condition == "wall_time"
    assert stops(RunState(config={"x": 1}, kind="eval"), "eval_skill") is None  # evaluation runs have none


def test_a_fork_counts_no_improvement_from_its_fork_step():
    stops = StopConditions(SkillConfig(stop_after_no_improvement=2))
    history_of = lambda n: tuple(type("R", (), {"step": i})() for i in range(1, n + 1))  # noqa: E731
    parent = RunState(config={"x": 1}, best_score=0.5, best_step=1, history=history_of(3))
    assert stops(parent, "start_step").condition == "no_improvement"
    fork = RunState(config={"x": 1}, best_score=0.5, best_step=1, history=history_of(3), fork_step=3)
    assert stops(fork, "start_step") is None


def test_cli_stop_exits_zero_with_a_resume_hint(tmp_path: Path):
    runner = CliRunner()
    db = f"sqlite:///{tmp_path / 'c.db'}"
    out = runner.invoke(cli, ["run", "--db", db, "--run-id", "c", "--set", "stop_after_no_improvement=1", "-q"])
    assert out.exit_code == 0, out.output
    assert "stopped: the best score" in out.output
    assert "skillstate resume c --set stop_after_no_improvement=..." in out.output
    bad = runner.invoke(cli, ["resume", "c", "--db", db, "--set", "batch_size=3"])
    assert bad.exit_code == 2 and "fork it" in bad.output
    done = runner.invoke(cli, ["resume", "c", "--db", db, "--set", "stop_after_no_improvement=50", "-q"])
    assert done.exit_code == 0 and "completed" in done.output
