"""`skillstate export-mlflow` of a policy training run (kind policy), read back from a local MLflow tracking
database: every metric TRL logged at its step, the validations per category, the evolutions, the params (the
base model's identity, the trainer's and LoRA's settings), the tags, and the checkpoints as a JSON artifact (no
weights); exporting again appends only what was logged since. Marker `policy` (the train extra)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # before mlflow is imported: nothing goes out
pytest.importorskip("mlflow")

from click.testing import CliRunner  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from policy_runs import policy_database  # noqa: E402

from skillstate.cli.main import cli  # noqa: E402
from skillstate.engine.runner import load_run  # noqa: E402
from skillstate.exports.mlflow_export import export_run  # noqa: E402
from skillstate.storage.store import Store  # noqa: E402

pytestmark = [pytest.mark.policy, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    pytest.importorskip("trl")
    root = tmp_path_factory.mktemp("mlflowpolicy")
    url = policy_database(root)
    return Store(url), url, f"sqlite:///{root / 'mlflow.db'}"


def mlflow_run(tracking, experiment, run_id):
    client = MlflowClient(tracking_uri=tracking)
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`skillstate.run_id` = '{run_id}'")
    return client, run


def history(client, run, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def logged(state):
    """Every (metric, step, value) of the log's PolicyTrained events, as MLflow keys them (the first of a metric
    at a step: TRL's closing row repeats the epoch)."""
    out = {}
    for t in state.policy.trained:
        for row in t.metrics:
            for k, v in row.items():
                if k != "step":
                    out.setdefault((f"train/{k}", int(row["step"])), v)
    return sorted((k, step, v) for (k, step), v in out.items())


@pytest.mark.parametrize("rid", ["sft", "grpo"])
def test_a_policy_run_read_back(world, rid):
    store, url, tracking = world
    res = CliRunner().invoke(cli, ["export-mlflow", rid, "--experiment", "policy", "--json", "--tracking-uri",
                                   tracking, "--db", url])
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(res.output)["runs"]
    assert entry["action"] == "created" and entry["steps_logged"] == 4 and entry["artifacts_logged"] == 2
    client, run = mlflow_run(tracking, "policy", rid)
    assert run.info.status == "FINISHED"
    state = load_run(store, rid).state
    p = state.policy
    # every metric TRL logged, at its step
    expected = logged(state)
    got = sorted((k, step, value) for k in {k for k, _, _ in expected} for step, value in history(client, run, k))
    assert got == expected and [s for k, s, _ in expected if k == "train/loss"] == [1, 2, 3, 4]
    assert any(k == "train/train_runtime" for k, _, _ in expected)  # the trainer's closing summary too
    if rid == "grpo":
        assert [s for s, _ in history(client, run, "train/reward")] == [1, 2, 3, 4]
    # each validation, overall and per category
    assert history(client, run, "val/gate") == [(v.step, v.scores.gate) for v in p.validated]
    for category in p.validated[-1].scores.by_task_type:
        assert history(client, run, f"val/by_task_type.{category}") == [
            (v.step, v.scores.by_task_type[category].hard) for v in p.validated]
    assert history(client, run, "evolution/accepted") == [(e.step, float(e.accepted)) for e in p.evolved]
    # params: the method, the base model's identity, the trainer's and LoRA's settings, and the config
    params = run.data.params
    s = p.started
    assert params["method"] == rid and params["base_model.path"] == s.base_model.path
    assert params["base_model.sha256"] == s.base_model.sha256
    assert params["trainer.args.max_steps"] == "4" and params["trainer.lora.r"] == "8"
    assert params["trainer.trainer"] == s.trainer_config["trainer"] and params["libraries.trl"]
    assert params["policy.max_steps"] == "4"  # the run's config
    tags = run.data.tags
    assert tags["skillstate.kind"] == "policy" and tags["skillstate.method"] == rid
    assert tags["skillstate.status"] == "completed" and tags["skillstate.exported_steps"] == "4"
    assert tags["skillstate.base_model_sha256"] == s.base_model.sha256
    # the checkpoints, listed with their hashes; no weights uploaded
    dst = Path(tracking[len("sqlite:///"):]).parent / f"got-{rid}"
    where = Path(client.download_artifacts(run.info.run_id, "", dst_path=str(dst)))
    assert sorted(f.name for f in where.iterdir()) == ["checkpoints.json", "policy.json"]
    assert json.loads((where / "checkpoints.json").read_text()) == [
        {"step": t.checkpoint.step, "path": t.checkpoint.path, "sha256": t.checkpoint.sha256} for t in p.trained]


def test_exporting_again_appends_only_what_was_logged_since(world):
    store, _url, tracking = world
    first = export_run(store, "grpo", tracking_uri=tracking, experiment="again")["runs"][0]
    assert first["action"] == "created"
    assert export_run(store, "grpo", tracking_uri=tracking, experiment="again")["runs"][0]["action"] == "unchanged"
    # as if the first export had happened after the first stretch and its validation (the run then grew)
    loaded = load_run(store, "grpo")
    mid = next(s for s in loaded.own if s.type == "PolicyValidated" and s.step == 2)
    client, run = mlflow_run(tracking, "again", "grpo")
    client.set_tag(run.info.run_id, "skillstate.head", f"{mid.seq}:{mid.hash}")
    again = export_run(store, "grpo", tracking_uri=tracking, experiment="again")["runs"][0]
    assert again["action"] == "updated" and again["steps_logged"] == 2
    client, run = mlflow_run(tracking, "again", "grpo")
    from skillstate.exports.mlflow_policy import event_metrics

    after = [s for s in loaded.own if s.seq > mid.seq]
    assert again["metrics_logged"] == len(event_metrics(after)) < first["metrics_logged"]
    losses = [(int(r["step"]), v) for t in loaded.state.policy.trained for r in t.metrics for k, v in r.items()
              if k == "loss"]
    assert history(client, run, "train/loss") == losses  # nothing twice
    assert [s for s, _ in history(client, run, "val/gate")] == [0, 2, 4]
