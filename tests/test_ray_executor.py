"""`executor: ray`: rollouts and evaluations as Ray tasks on a pool of
environment actors, on a local cluster (`ray.init(num_cpus=2)`), against
the same runs on threads. Marked `ray` (the slow stage of .ci/run runs them;
they need the `ray` extra). The checks of the config keys run by default."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, assert_paid_once, logical_usage

from skillstate.cli.main import cli
from skillstate.config import SkillConfig
from skillstate.config_views import semantic_view
from skillstate.engine.executors import pool_size
from skillstate.errors import BudgetStop, ConfigError
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import install_hint

QA = {"num_epochs": 1, "concurrency": 4, "llm_cache": "lineage"}
SQL = {"env": "sql", "num_epochs": 1, "batch_size": 6, "minibatch_size": 3, "concurrency": 4,
       "llm_cache": "lineage", "eval_test": False}
RAY = {"executor": "ray", "ray_num_cpus": 0.5}  # four actors on the two CPUs


def test_the_pool_has_one_actor_per_slot_as_far_as_the_cluster_has_cpus():
    assert pool_size(8, 1.0, 2.0) == 2
    assert pool_size(8, 0.5, 2.0) == 4
    assert pool_size(3, 0.5, 64.0) == 3
    assert pool_size(8, 0.0, 2.0) == 8  # actors that reserve nothing: one per slot
    assert pool_size(8, 4.0, 2.0) == 1  # never none


def test_an_unknown_executor_is_a_one_line_error(tmp_path):
    res = CliRunner().invoke(cli, ["run", "-q", "--set", "executor=dask", "--db", f"sqlite:///{tmp_path / 'e.db'}"])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1 and "executor" in res.output
    assert Store(f"sqlite:///{tmp_path / 'e.db'}").list_runs() == []


def test_executor_ray_without_ray_installed_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    db = f"sqlite:///{tmp_path / 'n.db'}"
    res = CliRunner().invoke(cli, ["run", "-q", "--set", "executor=ray", "--db", db])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [f"Error: executor ray needs Ray: {install_hint('ray')}"]
    assert Store(db).list_runs() == []  # refused before anything was written


def test_the_executor_keys_are_runtime_keys():
    a = SkillConfig(**QA).model_dump()
    b = SkillConfig(**QA, **RAY, ray_address="auto").model_dump()
    assert semantic_view(a) == semantic_view(b)  # a run may be resumed on the other executor


# -- on a local cluster ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def _payloads(store: Store, run_id: str) -> list[tuple[str, str]]:
    return [(s.type, s.payload) for s in store.read_events(run_id)]


def _same_run(a: Store, a_id: str, b: Store, b_id: str) -> None:
    """The same events, but for the runtime keys of the config in RunStarted."""
    pa, pb = _payloads(a, a_id), _payloads(b, b_id)
    assert [t for t, _ in pa] == [t for t, _ in pb]
    assert pa[1:] == pb[1:]
    assert semantic_view(json.loads(pa[0][1])["config"]) == semantic_view(json.loads(pb[0][1])["config"])


def _env_worker_pids(busy: bool = False) -> list[int]:
    """The environment actors' processes (Ray titles them after the actor, and the method running)."""
    pytest.importorskip("ray")  # first: importing ray puts its bundled psutil on the path
    import psutil

    title = "ray::EnvWorker.rollout" if busy else "ray::EnvWorker"
    return [p.pid for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith(title)]


@pytest.fixture(scope="module")
def on_threads(tmp_path_factory):
    """The default sim run and a tool-using (sql) run, on threads."""
    path = tmp_path_factory.mktemp("threads")
    qa = Trainer(SkillConfig(**QA), db=f"sqlite:///{path / 'qa.db'}", run_id="qa").train()
    sql = Trainer(SkillConfig(**SQL), db=f"sqlite:///{path / 'sql.db'}", run_id="sql").train()
    return qa, sql


@pytest.mark.ray
def test_a_run_on_ray_has_the_events_of_the_same_run_on_threads(cluster, on_threads, tmp_path):
    threads, _ = on_threads
    result = Trainer(SkillConfig(**QA, **RAY), db=f"sqlite:///{tmp_path / 'r.db'}", run_id="qa").train()
    assert result.summary["status"] == "completed"
    _same_run(threads.store, "qa", result.store, "qa")
    assert logical_usage(result.summary) == logical_usage(threads.summary)
    assert_paid_once(result.store, "qa")
    assert audit(result.store, "qa").ok
    report = verify(result.store, "qa")  # re-executed on threads from the journal: the driver journaled it all
    assert report.ok and report.checked == report.total


@pytest.mark.ray
def test_tool_using_episodes_on_ray_have_the_events_of_threads(cluster, on_threads, tmp_path):
    _, threads = on_threads
    result = Trainer(SkillConfig(**SQL, **RAY), db=f"sqlite:///{tmp_path / 's.db'}", run_id="sql").train()
    _same_run(threads.store, "sql", result.store, "sql")
    assert logical_usage(result.summary) == logical_usage(threads.summary)
    assert_paid_once(result.store, "sql")
    assert verify(result.store, "sql").ok


@pytest.mark.ray
def test_progressive_disclosure_on_ray_has_the_events_of_threads(cluster, tmp_path):
    skills = EXAMPLES / "skills"
    disclosed = {**QA, "initial_skill": str(skills / "exact-answers"), "disclosure": "tools",
                 "distractor_skills": [str(skills / "distractors" / "number-words")]}
    threads = Trainer(SkillConfig(**disclosed), db=f"sqlite:///{tmp_path / 't.db'}", run_id="d").train()
    result = Trainer(SkillConfig(**disclosed, **RAY), db=f"sqlite:///{tmp_path / 'r.db'}", run_id="d").train()
    _same_run(threads.store, "d", result.store, "d")  # the actors install the skills the driver's log holds
    assert result.summary["triggers"]["test_best"]["recall"] == threads.summary["triggers"]["test_best"]["recall"]
    assert_paid_once(result.store, "d")


@pytest.mark.ray
def test_a_worker_killed_in_the_middle_of_a_stage_loses_no_call_and_changes_no_event(cluster, on_threads,
                                                                                       tmp_path):
    """SIGKILL an environment actor while the first step's episodes run: Ray
    restarts it and retries its task, which is served every call the dead
    attempt journaled, and the run ends with the events of threads."""
    _, threads = on_threads
    killed: list[int] = []
    lock = threading.Lock()

    def kill_once(progress):
        if progress.kind != "calls" or progress.stage != "rollout" or progress.calls.done < 4:
            return
        with lock:
            if killed:
                return
            pid = (_env_worker_pids(busy=True) or _env_worker_pids())[0]  # one in an episode, if it can
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    store = Store(f"sqlite:///{tmp_path / 'k.db'}")
    result = Trainer(SkillConfig(**SQL, **RAY), store=store, run_id="sql", on_progress=kill_once).train()
    assert killed, "no worker was killed"
    assert result.summary["status"] == "completed"
    assert killed[0] not in _env_worker_pids()  # that process is gone; its actor was restarted elsewhere
    _same_run(threads.store, "sql", store, "sql")
    assert logical_usage(result.summary) == logical_usage(threads.summary)
    assert_paid_once(store, "sql")
    assert verify(store, "sql").ok


@pytest.mark.ray
def test_the_concurrency_cap_holds_across_the_cluster_and_workers_get_the_key(cluster, sim_server, tmp_path,
                                                                              monkeypatch):
    """Through the real openai client against the local server: never more
    than `concurrency` target calls at once, and every request carries the
    key the driver has (the workers started without it)."""
    monkeypatch.setenv("RAY_TEST_KEY", "sk-ray-test-0123456789")
    sim_server.latency = 0.05
    db = f"sqlite:///{tmp_path / 'o.db'}"
    cfg = SkillConfig(backend="openai", data=str(EXAMPLES / "qa"), num_epochs=1, batch_size=12, concurrency=3,
                      executor="ray", ray_num_cpus=0, llm_cache="lineage", eval_test=False,
                      target={"model": "sim-model", "base_url": sim_server.base_url, "api_key_env": "RAY_TEST_KEY"},
                      optimizer={"model": "sim-model", "base_url": sim_server.base_url,
                                 "api_key_env": "RAY_TEST_KEY"})
    result = Trainer(cfg, db=db, run_id="o").train()
    assert result.summary["status"] == "completed"
    spans = sorted((start, end) for role, start, end in sim_server.spans if role == "target")
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    assert most == 3  # the cap, reached and never passed
    assert set(sim_server.auth_headers) == {"Bearer sk-ray-test-0123456789"}
    assert "sk-ray-test" not in "".join(p for _, p in _payloads(result.store, "o"))


@pytest.mark.ray
def test_actors_that_no_node_could_host_are_refused_before_a_run_is_written(cluster, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    with pytest.raises(ConfigError, match=r"ray_num_cpus=3 is more than this machine's Ray has \(2 CPUs\)"):
        Trainer(SkillConfig(**QA, executor="ray", ray_num_cpus=3), store=store, run_id="c").train()
    assert store.list_runs() == []


@pytest.mark.ray
def test_a_custom_backend_factory_is_refused_on_ray(cluster, tmp_path):
    from skillstate.engine.runner import make_backend

    with pytest.raises(ConfigError, match="custom backend factory"):
        Trainer(SkillConfig(**QA, **RAY), db=f"sqlite:///{tmp_path / 'f.db'}", run_id="f",
                backend_factory=make_backend).train()


@pytest.mark.ray
def test_a_budget_stop_on_ray_stops_the_run_resumably(cluster, tmp_path):
    """The driver refuses a worker's claim once the budget is spent: the run
    stops at an event boundary, audits, and completes when resumed."""
    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    with pytest.raises(BudgetStop):
        Trainer(SkillConfig(**SQL, **RAY, max_cost_usd=0.002), store=store, run_id="b").train()
    assert audit(store, "b").ok
    resumed = Trainer(SkillConfig(**SQL, **RAY), store=store, run_id="b").train()
    assert resumed.summary["status"] == "completed"
    assert_paid_once(store, "b")


def test_a_cluster_address_that_takes_no_connection_is_refused_before_a_run_is_written(tmp_path):
    pytest.importorskip("ray")
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    db = f"sqlite:///{tmp_path / 'a.db'}"
    # in a process of its own: this one may be connected to the tests' local cluster already, which a run uses
    res = subprocess.run([sys.executable, "-m", "skillstate.cli.main", "run", "-q", "--set", "executor=ray",
                          "--set", f"ray_address=127.0.0.1:{port}", "--db", db],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        f"Error: executor ray: cannot join the Ray cluster at 127.0.0.1:{port}: 127.0.0.1:{port} takes no "
        "connection (Connection refused)"]
    assert Store(db).list_runs() == []


@pytest.mark.ray
@pytest.mark.textworlds
def test_a_scienceworld_run_on_ray_has_the_events_of_threads(cluster, tmp_path):
    """Each actor runs its own ScienceWorld JVM: the episodes, scores and events are those of threads."""
    pytest.importorskip("scienceworld")
    sw = {"env": "scienceworld", "llm_cache": "lineage", "concurrency": 2, "eval_test": False,
          "env_config": {"tasks": ["find-living-thing"], "items_per_split": {"train": 4, "val": 2, "test": 2}},
          "num_epochs": 1, "batch_size": 4, "minibatch_size": 2, "episode": {"max_turns": 20}}
    threads = Trainer(SkillConfig(**sw), db=f"sqlite:///{tmp_path / 't.db'}", run_id="sw").train()
    on_ray = Trainer(SkillConfig(**sw, executor="ray", ray_num_cpus=1), db=f"sqlite:///{tmp_path / 'r.db'}",
                     run_id="sw").train()
    assert on_ray.summary["status"] == "completed"
    _same_run(threads.store, "sw", on_ray.store, "sw")
    assert_paid_once(on_ray.store, "sw")
