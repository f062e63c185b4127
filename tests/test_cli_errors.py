"""Every user error: one clear line, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from skillstate.cli.main import cli


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('err') / 'e.db'}"
    res = CliRunner().invoke(cli, ["run", "--run-id", "base", "--epochs", "1", "-q", "--db", url])
    assert res.exit_code == 0, res.output
    return url


def user_error(db, *args, env=None, match=""):
    res = CliRunner().invoke(cli, [*args, "--db", db], env=env)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert "Traceback" not in res.output
    assert match in lines[0], lines[0]
    runs = CliRunner().invoke(cli, ["runs", "--json", "--db", db])
    assert [r["run_id"] for r in json.loads(runs.output)] == ["base"]  # no half-created run
    return lines[0]


def test_unknown_run(db):
    for cmd in (["show", "nope"], ["replay", "nope", "--to-step", "1"], ["audit", "nope"], ["log", "nope"],
                ["fork", "nope", "step_1"], ["export", "nope"]):
        user_error(db, *cmd, match="unknown run 'nope'")


def test_step_beyond_the_end(db):
    user_error(db, "replay", "--to-step", "99", match="step 99 is beyond the end")
    user_error(db, "fork", "step_99", match="step 99 is beyond the end")
    user_error(db, "show", "--step", "42", match="beyond the end")
    user_error(db, "export", "--step", "step_7", match="beyond the end")


def test_bad_step_syntax(db):
    user_error(db, "replay", "--to-step", "seven", match="not a step")


def test_bad_config_key(db):
    user_error(db, "run", "--set", "num_epoch=2", match="unknown config key 'num_epoch' (did you mean num_epochs?)")


def test_bad_config_value(db):
    user_error(db, "run", "--set", "gate_mixed_weight=2", match="gate_mixed_weight")
    user_error(db, "run", "--batch-size", "0", match="batch_size")
    user_error(db, "run", "--set", "edit_budget=1", match="min_edit_budget")
    user_error(db, "run", "--set", "gate_metric=best", match="gate_metric")


def test_bad_config_file(db, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_epochs: [1,\n")
    user_error(db, "run", "--config", str(bad), match="not valid YAML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[target]\nmodle = 'x'\n")
    user_error(db, "run", "--config", str(unknown), match="unknown config key 'target.modle'")
    user_error(db, "run", "--config", str(tmp_path / "missing.yaml"), match="cannot read config file")


def test_unreadable_data_file(db, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    user_error(db, "run", "--data", str(data), match="missing train.jsonl")
    user_error(db, "run", "--data", str(tmp_path / "nowhere"), match="does not exist")
    (data / "train.jsonl").write_bytes(b"\xff\xfe not utf8")
    user_error(db, "run", "--data", str(data), match="cannot read")


def test_malformed_data_file(db, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    good = '{"id": "a", "question": "q?", "answers": ["x"]}\n'
    (data / "val.jsonl").write_text(good.replace('"a"', '"v"'))
    (data / "test.jsonl").write_text(good.replace('"a"', '"t"'))
    (data / "train.jsonl").write_text(good + "{not json}\n")
    user_error(db, "run", "--data", str(data), match="train.jsonl: not valid JSON")
    (data / "train.jsonl").write_text('{"id": "a", "question": "q?"}\n')
    user_error(db, "run", "--data", str(data), match="item 1: answers: Field required")
    (data / "train.jsonl").write_text(good + good)
    user_error(db, "run", "--data", str(data), match="duplicate id 'a'")


def test_missing_api_key_with_backend_openai(db, tmp_path):
    env = {"OPENAI_API_KEY": None}
    user_error(db, "run", "--backend", "openai", "--model", "gpt-4o-mini", "--data", "examples/qa", env=env,
               match="set OPENAI_API_KEY")


def test_openai_backend_needs_a_model_and_data(db):
    user_error(db, "run", "--backend", "openai", "--data", "examples/qa", env={"OPENAI_API_KEY": "k"},
               match="needs a model")
    user_error(db, "run", "--backend", "openai", "--model", "m", env={"OPENAI_API_KEY": "k"},
               match="needs a dataset")


def test_other_bad_arguments(db, tmp_path):
    user_error(db, "replay", match="exactly one of --to-step N or --verify")
    user_error(db, "fork", "base", "1", "2", match="fork takes [RUN] STEP")
    user_error(db, "fork", "base", "1", "--set", "data=elsewhere", match="a fork cannot change data")
    user_error(db, "run", "--set", "prompts.nonsense=x.md", match="unknown prompt 'nonsense'")
    user_error(db, "run", "--set", "noequals", match="--set takes key=value")
    user_error(db, "run", "--run-id", "base", "--lr", "constant", match="was started with lr_scheduler")


def test_bad_database_url(tmp_path):
    for url in ("nonsense", f"sqlite:///{tmp_path}/no/such/dir/x.db"):
        res = CliRunner().invoke(cli, ["runs", "--db", url])
        assert res.exit_code == 2 and "Traceback" not in res.output
        assert res.output.startswith("Error: ") and len(res.output.strip().splitlines()) == 1, res.output
