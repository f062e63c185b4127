"""End-to-end CLI tests with click's CliRunner on the sim backend."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from skillstate.cli.main import cli


@pytest.fixture
def runner():
    return CliRunner()


def _base_run(url):
    res = CliRunner().invoke(cli, ["run", "--run-id", "base", "--epochs", "2", "--db", url])
    assert res.exit_code == 0, res.output


@pytest.fixture
def cli_db(tmp_path, run_templates):
    """A database holding one finished small sim run with id `base` (a copy of one `skillstate run` built once
    per worker)."""
    return run_templates.copy("cli_base", _base_run, tmp_path / "cli.db")


def call(runner, *args, code=0):
    res = runner.invoke(cli, list(args))
    assert res.exit_code == code, res.output
    return res


def test_run_shows_progress_per_stage_and_a_summary(tmp_path, runner):
    res = call(runner, "run", "--epochs", "1", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    out = res.output
    for stage in ("baseline", "step 1/3", "rollout", "reflect", "aggregate", "select", "update", "evaluate",
                  "gate", "test"):
        assert stage in out
    assert "best (step" in out and "LLM calls" in out and "optimizer" in out and "target" in out
    assert "test by task type" in out


def test_db_comes_from_env_when_no_flag(tmp_path, runner, monkeypatch):
    monkeypatch.setenv("SKILLSTATE_DB", f"sqlite:///{tmp_path / 'env.db'}")
    call(runner, "run", "--epochs", "1", "-q")
    assert (tmp_path / "env.db").exists()


def test_runs_log_and_show(cli_db, runner):
    rows = json.loads(call(runner, "runs", "--json", "--db", cli_db).output)
    assert rows[0]["run_id"] == "base" and rows[0]["status"] == "completed"
    assert "base" in call(runner, "runs", "--db", cli_db).output
    events = json.loads(call(runner, "log", "--json", "--db", cli_db).output)
    assert events[0]["type"] == "RunStarted" and events[-1]["type"] == "RunCompleted"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    step3 = json.loads(call(runner, "log", "base", "--step", "step_3", "--json", "--db", cli_db).output)
    assert {e["payload"]["step"] for e in step3} == {3}
    assert {"StepStarted", "RolloutCompleted", "PatchProposed", "EditsSelected", "GateDecided"} <= {
        e["type"] for e in step3}
    assert "GateDecided" in call(runner, "log", "--step", "3", "--db", cli_db).output
    show = call(runner, "show", "--db", cli_db).output
    assert "decision" in show and "baseline" in show
    detail = json.loads(call(runner, "show", "--step", "2", "--json", "--db", cli_db).output)
    assert detail["step"] == 2 and "rollout" in detail and "decision" in detail
    assert "gate:" in call(runner, "show", "--step", "2", "--db", cli_db).output


def test_replay_to_step_folds_the_log(cli_db, runner):
    snap = json.loads(call(runner, "replay", "--to-step", "step_3", "--json", "--db", cli_db).output)
    for key in ("run_id", "step", "current_skill", "best_skill", "current_score", "best_score", "best_step"):
        assert key in snap
    assert snap["step"] == 3 and snap["decision"]["decision"] in ("accept_best", "accept", "reject", "skip")
    zero = json.loads(call(runner, "replay", "--to-step", "0", "--json", "--db", cli_db).output)
    assert zero["best_step"] == 0 and zero["current_skill"] == zero["best_skill"]
    assert zero["current_score"] == zero["best_score"] == zero["baseline"]["gate"]
    text = call(runner, "replay", "base", "--to-step", "3", "--db", cli_db).output
    assert "after step 3" in text and "current skill" in text


def test_replay_verify_and_audit(cli_db, runner):
    assert "reproduces all" in call(runner, "replay", "--verify", "--db", cli_db).output
    assert "intact" in call(runner, "audit", "--db", cli_db).output
    assert json.loads(call(runner, "audit", "--json", "--db", cli_db).output)["ok"] is True


def test_fork_with_another_schedule_continues_training(cli_db, runner):
    out = call(runner, "fork", "step_2", "--lr", "linear", "--run-id", "child", "--db", cli_db).output
    assert "forked child from base at step 2" in out and "completed" in out
    rows = {r["run_id"]: r for r in json.loads(call(runner, "runs", "--json", "--db", cli_db).output)}
    assert rows["child"]["parent_run_id"] == "base" and rows["child"]["fork_step"] == 2
    own = json.loads(call(runner, "log", "child", "--json", "--db", cli_db).output)
    assert own[0]["type"] == "RunForked" and own[0]["payload"]["overrides"] == {"lr_scheduler": "linear"}
    assert own[0]["payload"]["config"]["lr_scheduler"] == "linear"
    assert not any(e["type"] == "BaselineEvaluated" for e in own)  # the parent's events are not copied
    parent2 = json.loads(call(runner, "replay", "base", "--to-step", "2", "--json", "--db", cli_db).output)
    child2 = json.loads(call(runner, "replay", "child", "--to-step", "2", "--json", "--db", cli_db).output)
    for key in ("current_skill", "best_skill", "current_score", "best_score", "best_step"):
        assert child2[key] == parent2[key]
    assert "intact" in call(runner, "audit", "child", "--db", cli_db).output
    assert "reproduces all" in call(runner, "replay", "child", "--verify", "--db", cli_db).output
    show = json.loads(call(runner, "show", "child", "--json", "--db", cli_db).output)
    # step 3's rollout uses the same skill and batch as the parent's: served from the call table
    assert show["usage"]["target"]["sent"] < show["usage"]["target"]["calls"]


def test_fork_no_run_then_resume(cli_db, runner):
    call(runner, "fork", "base", "1", "--edit-budget", "2", "--set", "min_edit_budget=1", "--run-id", "f2",
         "--no-run", "--db", cli_db)
    rows = {r["run_id"]: r for r in json.loads(call(runner, "runs", "--json", "--db", cli_db).output)}
    assert rows["f2"]["status"] == "step 1/6"
    call(runner, "run", "--run-id", "f2", "-q", "--db", cli_db)
    rows = {r["run_id"]: r for r in json.loads(call(runner, "runs", "--json", "--db", cli_db).output)}
    assert rows["f2"]["status"] == "completed"


def test_export_and_diff(cli_db, runner, tmp_path):
    best = call(runner, "export", "--db", cli_db).output
    snap = json.loads(call(runner, "replay", "--to-step", "6", "--json", "--db", cli_db).output)
    assert best == snap["best_skill"]
    target = tmp_path / "skill.md"
    call(runner, "export", "--step", "0", "-o", str(target), "--db", cli_db)
    assert target.read_text().startswith("# Question answering")
    d = call(runner, "diff", "0", "6", "--db", cli_db).output
    assert d.startswith("--- base@step_0") and "+++ base@step_6" in d
    assert "(no difference)" in call(runner, "diff", "base", "2", "2", "--db", cli_db).output


def test_db_upgrade_is_idempotent(tmp_path, runner):
    url = f"sqlite:///{tmp_path / 'up.db'}"
    assert "upgraded from empty" in call(runner, "db", "upgrade", "--db", url).output
    assert "latest revision" in call(runner, "db", "upgrade", "--db", url).output


def test_every_command_has_help_with_an_example(runner):
    for name in cli.commands:
        text = call(runner, name, "--help").output
        if name == "db":
            text = call(runner, "db", "upgrade", "--help").output
        assert "Example" in text, name


def test_resume_with_a_changed_setting_is_refused(cli_db, runner):
    res = call(runner, "run", "--run-id", "base", "--edit-budget", "7", "--db", cli_db, code=2)
    assert "was started with edit_budget=4" in res.output and "fork" in res.output


def test_rerunning_a_completed_run_only_prints_its_summary(cli_db, runner):
    out = call(runner, "run", "--run-id", "base", "--db", cli_db).output
    assert "resuming run base" in out and "step 1/" not in out and "completed" in out


def test_why_traces_a_sentence_to_its_step_and_analysts(cli_db, runner):
    history = json.loads(call(runner, "show", "--json", "--db", cli_db).output)
    assert history["new_best"] >= 1
    # the harmful line of the initial skill: removed by some accepted step, or still there
    info = json.loads(call(runner, "why", "single word", "--json", "--db", cli_db).output)
    assert info["in_initial_skill"] is True
    assert all(c["change"] in ("added", "removed") for c in info["changes"])
    # a line the run added: pick one from the diff between the baseline and the end
    added = [ln[1:] for ln in call(runner, "diff", "0", "6", "--db", cli_db).output.splitlines()
             if ln.startswith("+") and not ln.startswith("+++")]
    assert added
    info = json.loads(call(runner, "why", "--json", "--db", cli_db, "--", "base", added[0]).output)
    assert info["in_current_skill"] and not info["in_initial_skill"]
    origin = info["origin"]
    assert origin and info["changes"][-1] == {**info["changes"][-1], "change": "added", "step": origin["step"]}
    assert any(added[0].strip() in e["content"] or e["content"].strip() in added[0] for e in origin["kept_edits"])
    assert origin["proposed_by"] and origin["proposed_by"][0]["items"]
    text = call(runner, "why", "--db", cli_db, "--", added[0]).output
    assert f"step {origin['step']} kept (patch):" in text and "proposed by the" in text


def test_log_lineage_of_a_fork_starts_with_the_parent(cli_db, runner):
    call(runner, "fork", "base", "2", "--run-id", "kid", "--no-run", "--db", cli_db)
    rows = json.loads(call(runner, "log", "kid", "--lineage", "--json", "--db", cli_db).output)
    assert rows[0]["run_id"] == "base" and rows[-1]["run_id"] == "kid" and rows[-1]["type"] == "RunForked"
    assert rows[-1]["prev_hash"] == rows[-2]["hash"]
