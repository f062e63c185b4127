"""What goes wrong in multi-turn runs is visible: failed target calls that end
episodes trip the breaker, an environment that raises stops the run in one
line, episodes that start alike are sent once so verify holds with a random
model, and a fork cannot change what an inherited score measured."""

from __future__ import annotations

import random
import sys

import pytest
from conftest import EXAMPLES

from skillstate.config import SkillConfig
from skillstate.engine.create import fork_run
from skillstate.errors import ConfigError, EnvStop, LLMStop
from skillstate.llm.base import ChatResponse
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer


@pytest.fixture(autouse=True)
def rooms_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_episode"))
    yield
    sys.modules.pop("rooms_env", None)


def _config(env: str = "python:rooms_env:RoomsEnv", **kw) -> SkillConfig:
    base = {"env": env, "num_epochs": 1, "batch_size": 10, "minibatch_size": 5, "episode": {"max_turns": 20}}
    return SkillConfig(**{**base, **kw})


def _wrapping(target):
    """A backend factory: the optimizer is the sim's, the target is `target(request, real)`."""
    from skillstate.engine.runner import make_backend

    def factory(config, env, role):
        real = make_backend(config, env, role)

        class Wrapped:
            name = real.name

            def complete(self, request):
                if "<skill>" in request.message_dicts()[-1]["content"]:
                    return real.complete(request)
                return target(request, real)

        return Wrapped()

    return factory


def test_target_failures_that_end_most_episodes_trip_the_breaker_though_few_calls_fail(tmp_path):
    count = {"n": 0}

    def flaky(request, real):
        count["n"] += 1
        if count["n"] % 4 == 0:  # a quarter of the calls: under the calls' share, but it ends most episodes
            raise RuntimeError("upstream hiccup")
        return real.complete(request)

    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    with pytest.raises(LLMStop, match=r"rollouts of stage baseline ended on a failed target call"):
        Trainer(_config(), store=store, run_id="f", backend_factory=_wrapping(flaky)).train()
    assert audit(store, "f").ok
    assert [s.type for s in store.read_events("f")] == ["RunStarted"]  # the stage was not appended


def test_an_environment_that_raises_stops_the_run_in_one_line_and_resumes(tmp_path, monkeypatch):
    import rooms_env

    original = rooms_env.RoomsSession.step

    def broken(self, action):
        if self.house.obj == "candle":
            raise RuntimeError("the world fell over")
        return original(self, action)

    monkeypatch.setattr(rooms_env.RoomsSession, "step", broken)
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    with pytest.raises(EnvStop, match=r"env 'python:rooms_env:RoomsEnv' failed on item 'house-\d+': "
                                      r"RuntimeError: the world fell over"):
        Trainer(_config(), store=store, run_id="e").train()
    assert audit(store, "e").ok
    monkeypatch.setattr(rooms_env.RoomsSession, "step", original)
    assert Trainer(store=store, run_id="e").train().summary["status"] == "completed"


def test_the_cli_says_an_environment_failure_in_one_line(tmp_path, monkeypatch):
    import rooms_env
    from click.testing import CliRunner

    from skillstate.cli.main import cli

    monkeypatch.setattr(rooms_env.RoomsSession, "step", lambda self, action: 1 / 0)
    res = CliRunner().invoke(cli, ["run", "--env", "python:rooms_env:RoomsEnv", "--epochs", "1", "-q",
                                   "--db", f"sqlite:///{tmp_path / 'c.db'}", "--run-id", "c"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert "ZeroDivisionError" in lines[0] and "skillstate resume c" in lines[0] and "Traceback" not in res.output


class TwinHouses:
    """Every item is the same house: every episode starts alike."""

    @staticmethod
    def splits(cls, config, names):
        return {name: [{"id": f"{name}-{i}", "task_type": "find_object", "seed": 7} for i in range(8)]
                for name in names}


def test_episodes_that_start_alike_send_each_request_once_so_verify_holds_with_a_random_model(tmp_path,
                                                                                              monkeypatch):
    import rooms_env

    monkeypatch.setattr(rooms_env.RoomsEnv, "builtin_splits", classmethod(TwinHouses.splits))
    moves = ["look around", "move north", "move south", "move east", "move west", "open door to north",
             "open door to east", "take key", "take coin", "take apple", "take book", "take candle"]

    def random_agent(request, real):  # a model that answers the same prompt differently every time
        return ChatResponse(text=f"Action: {random.choice(moves)}", prompt_tokens=5, completion_tokens=3)

    cfg = _config(concurrency=8, batch_size=8, eval_test=False, max_stage_failure_share=1.0)
    result = Trainer(cfg, db=f"sqlite:///{tmp_path / 't.db'}", run_id="t",
                     backend_factory=_wrapping(random_agent)).train()
    rollout = next(s.event for s in result.store.read_events("t") if s.type == "RolloutCompleted")
    first = {r.calls[0].request_hash for r in rollout.results}
    assert len(first) == 1  # eight episodes, one first request ...
    hashes = [c.request_hash for c in result.store.read_calls("t")]
    assert len(hashes) == len(set(hashes))  # ... and no request was ever sent twice
    report = verify(result.store, "t")
    assert report.ok and report.checked == report.total


@pytest.mark.parametrize("override", [{"episode.max_turns": 9}, {"episode": {"history": 2}},
                                      {"episode.max_invalid": 2}])
def test_a_fork_cannot_change_what_an_inherited_score_measured(tmp_path, override):
    store = Store(f"sqlite:///{tmp_path / 'k.db'}")
    Trainer(_config(), store=store, run_id="p").train()
    with pytest.raises(ConfigError, match="a fork cannot change episode"):
        fork_run(store, "p", 1, override, probe=False)


def test_a_fork_may_change_the_analysts_window(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'k.db'}")
    Trainer(_config(), store=store, run_id="p").train()
    child = fork_run(store, "p", 1, {"episode.reflect_last": 2}, run_id="c", probe=False)
    assert Trainer(store=store, run_id=child).train().summary["status"] == "completed"


def test_a_sim_world_asked_about_a_task_it_does_not_hold_says_so():
    from skillstate.envs.sql import SqlConfig, SqlEnv
    from skillstate.sim.agents import ToolWorld

    env = SqlEnv(SqlEnv.builtin_splits(SqlConfig(), ["train", "val", "test"]), SqlConfig())
    with pytest.raises(LookupError, match="has no task"):
        ToolWorld(env).reply([{"role": "user", "content": "What is the airspeed of a swallow?"}], [])

