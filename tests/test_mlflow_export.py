"""`skillstate export-mlflow`: a run read back from a local MLflow tracking
store holds the config, one metric point per step, the test reports and the
skills; exporting again never duplicates it, a run that grew gets only its
new steps, and a fork is a nested run of its parent's."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
from click.testing import CliRunner
from conftest import small_config

from skillstate.cli.main import cli
from skillstate.config_views import flatten_keys
from skillstate.engine.runner import load_run
from skillstate.errors import UserError
from skillstate.exports.mlflow_common import config_params
from skillstate.exports.mlflow_export import export_run
from skillstate.reading.audit import head
from skillstate.reading.curves import run_curves
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import install_hint

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # before mlflow is imported: nothing goes out
# mlflow is imported by the tests that use it, not here: importing it takes seconds, and every test
# worker collects this module
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                 reason="the mlflow extra is not installed"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # MLflow's own use of SQLAlchemy


def MlflowClient(**kw):  # noqa: N802 (mlflow's client, imported when a test first asks for it)
    from mlflow import MlflowClient as client

    return client(**kw)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A skillstate database (`base`, 6 steps; `fk`, its fork at step 3; `grow`, stopped after step 2 or so) and
    one SQLite MLflow tracking database."""
    root = tmp_path_factory.mktemp("mlflow")
    url = f"sqlite:///{root / 'runs.db'}"
    store = Store(url)
    trainer = Trainer(small_config(), store=store, run_id="base")
    trainer.train()
    trainer.fork(step=3, overrides={"lr_scheduler": "linear"}, new_run_id="fk").train()
    Trainer(small_config(stop_after_no_improvement=1), store=store, run_id="grow").train()
    yield store, url, f"sqlite:///{root / 'mlflow.db'}", root
    store.close()


def export(url, tracking, *args, code=0):
    res = CliRunner().invoke(cli, ["export-mlflow", *args, "--tracking-uri", tracking, "--db", url])
    assert res.exit_code == code, res.output
    return res


def mlflow_runs(tracking, experiment, run_id):
    client = MlflowClient(tracking_uri=tracking)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], filter_string=f"tags.`skillstate.run_id` = '{run_id}'")


def history(client, mlflow_run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(mlflow_run_id, key)]


def test_a_run_read_back(world, tmp_path):
    store, url, tracking, _root = world
    result = json.loads(export(url, tracking, "base", "--experiment", "readback", "--json").output)
    (entry,) = result["runs"]
    assert entry["action"] == "created" and entry["steps_logged"] == 6
    client, (run,) = mlflow_runs(tracking, "readback", "base")
    assert run.info.run_id == entry["mlflow_run_id"] and run.info.status == "FINISHED"
    loaded = load_run(store, "base")
    state, curves = loaded.state, run_curves(loaded)
    # params: the whole config, dotted
    params = run.data.params
    assert set(params) == set(flatten_keys(dict(state.config)))
    assert params["num_epochs"] == "2" and params["gate_metric"] == "hard" and params["optimizer.api_key_env"]
    # one point per step, at its step
    steps = [r["step"] for r in curves["steps"]]
    for key in ("current_score", "best_score", "edit_budget", "cost_usd", "cumulative_cost_usd", "calls", "decision"):
        assert [s for s, _ in history(client, run.info.run_id, key)] == steps, key
    assert [v for _, v in history(client, run.info.run_id, "current_score")] == [r["current_score"]
                                                                                 for r in curves["steps"]]
    with_candidate = [r["step"] for r in curves["steps"] if r["candidate_score"] is not None]
    assert [s for s, _ in history(client, run.info.run_id, "candidate_score")] == with_candidate
    decisions = dict(history(client, run.info.run_id, "decision"))
    assert sum(1 for v in decisions.values() if v == -1) == state.count("reject")
    assert sum(1 for v in decisions.values() if v == 2) == state.count("accept_best")
    # the test reports
    metrics = run.data.metrics
    best, base = state.tests["best"].scores, state.tests["baseline"].scores
    assert metrics["test.best.hard"] == best.hard and metrics["test.baseline.soft"] == base.soft
    for task_type, scores in best.by_task_type.items():
        assert metrics[f"test.best.by_task_type.{task_type}.hard"] == scores.hard
    assert metrics["baseline.gate"] == state.baseline.gate and metrics["final.best_step"] == state.best_step
    # tags
    tags = run.data.tags
    assert tags["skillstate.head"] == str(head(store, "base")) and tags["skillstate.status"] == "completed"
    assert tags["skillstate.database"] == store.display_url and tags["skillstate.exported_steps"] == "6"
    assert "mlflow.parentRunId" not in tags
    # artifacts: each accepted step's skill, the initial and the best skill, the curves
    accepted = {f"skills/step_{rec.step:03d}.md" for rec in state.history if rec.decision in ("accept", "accept_best")}
    listed = {f.path for f in client.list_artifacts(run.info.run_id, "skills")}
    assert listed == accepted | {"skills/initial.md", "skills/best.md"}
    assert {f.path for f in client.list_artifacts(run.info.run_id)} == {"skills", "curves.json"}
    out = CliRunner().invoke(cli, ["export", "base", "--best", "-o", str(tmp_path / "best.md"), "--db", url])
    assert out.exit_code == 0, out.output
    best_md = client.download_artifacts(run.info.run_id, "skills/best.md", str(tmp_path))
    assert open(best_md, encoding="utf-8").read() == (tmp_path / "best.md").read_text(encoding="utf-8")
    first_accept = min(accepted)
    step = int(first_accept[len("skills/step_"):-3])
    skill = client.download_artifacts(run.info.run_id, first_accept, str(tmp_path / "dl"))
    assert open(skill, encoding="utf-8").read() == store.get_blob(state.record(step).current_skill)
    curves_json = client.download_artifacts(run.info.run_id, "curves.json", str(tmp_path / "dl"))
    assert json.load(open(curves_json, encoding="utf-8"))["steps"] == json.loads(json.dumps(curves["steps"]))


def test_exporting_twice_leaves_one_run_unchanged(world):
    _store, url, tracking, _root = world
    export(url, tracking, "base", "--experiment", "twice")
    client, (run,) = mlflow_runs(tracking, "twice", "base")
    lengths = {key: len(client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics}
    out = export(url, tracking, "base", "--experiment", "twice").output
    assert "already exported" in out and run.info.run_id in out
    client, runs = mlflow_runs(tracking, "twice", "base")
    assert [r.info.run_id for r in runs] == [run.info.run_id]
    assert {key: len(client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics} == lengths
    assert runs[0].data.tags == run.data.tags


def test_a_fork_is_a_nested_run_of_its_parent(world):
    store, url, tracking, _root = world
    result = export_run(store, "fk", tracking_uri=tracking, experiment="forks")
    assert [(r["run_id"], r["action"]) for r in result["runs"]] == [("base", "created"), ("fk", "created")]
    client, (parent,) = mlflow_runs(tracking, "forks", "base")
    _, (child,) = mlflow_runs(tracking, "forks", "fk")
    tags = child.data.tags
    assert tags["mlflow.parentRunId"] == parent.info.run_id == result["runs"][1]["parent_mlflow_run_id"]
    assert tags["skillstate.fork_step"] == "3" and tags["skillstate.parent_run_id"] == "base"
    assert json.loads(tags["skillstate.overrides"]) == {"lr_scheduler": "linear"}
    assert child.data.params["lr_scheduler"] == "linear"
    # the fork logs its own steps: the inherited ones are the parent's
    assert [s for s, _ in history(client, child.info.run_id, "current_score")] == [4, 5, 6]
    assert [s for s, _ in history(client, parent.info.run_id, "current_score")] == [1, 2, 3, 4, 5, 6]
    assert "skills/fork_start.md" in {f.path for f in client.list_artifacts(child.info.run_id, "skills")}
    # the parent is found again, not exported twice
    again = export_run(store, "fk", tracking_uri=tracking, experiment="forks")
    assert [r["action"] for r in again["runs"]] == ["unchanged", "unchanged"]


def test_a_run_exported_mid_way_gets_only_its_new_steps(world):
    store, url, tracking, _root = world
    first = export_run(store, "grow", tracking_uri=tracking, experiment="growth")["runs"][0]
    stopped_at = load_run(store, "grow").state.last_completed_step
    assert first["action"] == "created" and first["steps_logged"] == stopped_at < 6
    client, (run,) = mlflow_runs(tracking, "growth", "grow")
    assert run.info.status == "KILLED" and run.data.tags["skillstate.exported_steps"] == str(stopped_at)
    assert "test.best.hard" not in run.data.metrics
    Trainer(small_config(), store=store, run_id="grow").train()  # resumed without the stop condition: completes
    second = export_run(store, "grow", tracking_uri=tracking, experiment="growth")["runs"][0]
    assert second["action"] == "updated" and second["steps_logged"] == 6 - stopped_at
    assert second["mlflow_run_id"] == first["mlflow_run_id"] and second["params_logged"] == 0
    client, (run,) = mlflow_runs(tracking, "growth", "grow")
    assert [s for s, _ in history(client, run.info.run_id, "current_score")] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in history(client, run.info.run_id, "edit_budget")] == [1, 2, 3, 4, 5, 6]
    assert run.info.status == "FINISHED" and run.data.tags["skillstate.head"] == str(head(store, "grow"))
    assert run.data.metrics["test.best.hard"] == load_run(store, "grow").state.tests["best"].scores.hard
    assert export_run(store, "grow", tracking_uri=tracking, experiment="growth")["runs"][0]["action"] == "unchanged"


def test_another_log_under_the_same_run_id_is_refused(world, tmp_path):
    store, url, tracking, _root = world
    export_run(store, "base", tracking_uri=tracking, experiment="clash")
    other = Store(f"sqlite:///{tmp_path / 'other.db'}")
    Trainer(small_config(num_epochs=1), store=other, run_id="base").train()
    with pytest.raises(UserError, match="is not in this log"):
        export_run(other, "base", tracking_uri=tracking, experiment="clash")
    other.close()
    _, runs = mlflow_runs(tracking, "clash", "base")
    assert len(runs) == 1


def test_an_evaluation_run_is_params_and_its_report(world, tmp_path):
    store, url, tracking, _root = world
    skill = tmp_path / "s.md"
    skill.write_text("# Answer\n\n- Be brief.\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["eval", "--skill", str(skill), "--run-id", "ev", "-q", "--db", url])
    assert res.exit_code == 0, res.output
    entry = export_run(store, "ev", tracking_uri=tracking, experiment="evals")["runs"][0]
    assert entry["steps_logged"] == 0
    _, (run,) = mlflow_runs(tracking, "evals", "ev")
    assert run.data.metrics["test.eval.hard"] == load_run(store, "ev").state.tests["eval"].scores.hard
    assert run.data.tags["skillstate.kind"] == "eval" and run.info.status == "FINISHED"


def test_a_file_store(world, tmp_path, monkeypatch):
    store, url, _tracking, _root = world
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    res = export(url, uri, "base", code=2)  # MLflow 3 wants an opt-in for its file store: one line says so
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "MLFLOW_ALLOW_FILE_STORE" in lines[0]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert "exported to MLflow run" in export(url, uri, "base").output
    assert "already exported" in export(url, uri, "base").output
    client, (run,) = mlflow_runs(uri, "skillstate", "base")
    assert len(client.get_metric_history(run.info.run_id, "current_score")) == 6
    assert run.data.params["seed"] == "42"


def test_secrets_stay_home():
    params = config_params({"target": {"base_url": "https://user:hunter2@llm.example/v1", "api_key_env": "MY_KEY",
                                       "api_key": "sk-abcdefghijklmnopqrstuvwxyz123456"},
                            "prompts": {"reflect": "x" * 9000}}, limit=6000)
    assert "hunter2" not in json.dumps(params) and "sk-abc" not in json.dumps(params)
    assert params["target.api_key_env"] == "MY_KEY" and params["target.api_key"] == "***"
    assert len(params["prompts"]) == 6000 and params["prompts"].endswith("...")


def test_refusals_are_one_line(world, monkeypatch):
    _store, url, tracking, _root = world
    for args, match in ((["nope"], "unknown run 'nope'"),
                        (["base", "--experiment", " "], "--experiment must not be empty")):
        res = export(url, tracking, *args, code=2)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and match in lines[0] and "Traceback" not in res.output, res.output
    monkeypatch.setitem(sys.modules, "mlflow", None)
    res = export(url, tracking, "base", code=2)
    assert res.output.strip() == f"Error: exporting to MLflow needs mlflow: {install_hint('mlflow')}"


def test_a_run_of_a_skill_directory_logs_its_best_skill_as_an_archive_that_installs(tmp_path):
    from conftest import EXAMPLES

    from skillstate.skilltree import load_skill, validate_skill

    url = f"sqlite:///{tmp_path / 'dir.db'}"
    store = Store(url)
    Trainer(small_config(num_epochs=1, initial_skill=str(EXAMPLES / "skills" / "short-answers")), store=store,
            run_id="d").train()
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    export(url, tracking, "d", "--experiment", "dirs")
    client, (run,) = mlflow_runs(tracking, "dirs", "d")
    assert "skills/short-answers.skill" in {f.path for f in client.list_artifacts(run.info.run_id, "skills")}
    got = load_skill(client.download_artifacts(run.info.run_id, "skills/short-answers.skill", str(tmp_path)))
    assert validate_skill(got.tree, got.dir_name).ok
    exported = CliRunner().invoke(cli, ["export", "d", "-o", str(tmp_path / "x.skill"), "--db", url])
    assert exported.exit_code == 0, exported.output
    assert got.tree == load_skill(tmp_path / "x.skill").tree
    store.close()


def test_a_disclosure_run_logs_its_trigger_rates(tmp_path):
    from conftest import EXAMPLES

    skills = EXAMPLES / "skills"
    url = f"sqlite:///{tmp_path / 'disclosure.db'}"
    store = Store(url)
    Trainer(small_config(num_epochs=1, initial_skill=str(skills / "exact-answers"), disclosure="tools",
                         distractor_skills=[str(skills / "distractors" / "number-words")]), store=store,
            run_id="t").train()
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    export(url, tracking, "t", "--experiment", "triggers")
    _client, (run,) = mlflow_runs(tracking, "triggers", "t")
    metrics = run.data.metrics
    assert metrics["triggers.test_best.recall"] > metrics["triggers.test_baseline.recall"]
    assert {"triggers.baseline.precision", "triggers.test_best.wrong_loads"} <= set(metrics)
    store.close()


def test_a_bank_run_logs_its_banks_as_json_and_bank_metrics_per_step(tmp_path):
    from skillstate.bank.document import read_bank
    from skillstate.log.events_bank import BankValidated

    url = f"sqlite:///{tmp_path / 'bank.db'}"
    store = Store(url)
    Trainer(small_config(num_epochs=1, mode="bank"), store=store, run_id="b").train()
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    export(url, tracking, "b", "--experiment", "banks")
    client, (run,) = mlflow_runs(tracking, "banks", "b")
    loaded = load_run(store, "b")
    state = loaded.state
    listed = {f.path for f in client.list_artifacts(run.info.run_id, "skills")}
    assert "skills/best.json" in listed and not any(p.endswith(".md") for p in listed)
    best = client.download_artifacts(run.info.run_id, "skills/best.json", str(tmp_path))
    assert read_bank(open(best, encoding="utf-8").read()) == read_bank(store.get_blob(state.best_skill))
    steps = [rec.step for rec in state.history]
    sizes = history(client, run.info.run_id, "bank.size")
    assert sizes == [(rec.step, float(len(read_bank(store.get_blob(rec.current_skill)).skills)))
                     for rec in state.history]
    hits = history(client, run.info.run_id, "bank.retrieval_hit_rate")
    assert [s for s, _ in hits] == steps and all(0 <= v <= 1 for _, v in hits)
    assert history(client, run.info.run_id, "edit_budget") == []
    validations = [s.event for s in loaded.lineage if isinstance(s.event, BankValidated)]
    assert validations
    for ev in validations:
        assert (ev.step, ev.scores.gate) in history(client, run.info.run_id, "bank.validation.gate")
        for category, score in ev.scores.by_task_type.items():
            assert (ev.step, score.hard) in history(client, run.info.run_id, f"bank.validation.by_task_type.{category}")
    store.close()
