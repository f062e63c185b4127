"""Training a skill on its own evals (env evals), end to end: the example skill trains offline with no
--data, passes audit and replay --verify, exports a skill that passes `skill check` and skill-creator's
gradings; a kill -9 while grading resumes with no call paid twice; a fork with another judge re-grades
with it and reuses the target's calls; the real openai client against sim-server with the judge on its
own endpoint; and the refusals of what cannot be trained on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import assert_paid_once
from run_helpers import call, kill_at_pause, start_driver

from skillstate.cli.main import cli
from skillstate.sim.server import SimServer
from skillstate.storage.store import Store

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "skills" / "meeting-notes"


def _show(db: str, run_id: str) -> dict:
    return json.loads(call("show", run_id, "--json", "--db", db))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The example trained with its defaults, three judge samples and a judge that errs 10 % of the time."""
    tmp = tmp_path_factory.mktemp("evals")
    db = f"sqlite:///{tmp / 'e.db'}"
    call("run", "--db", db, "--run-id", "notes", "--set", f"initial_skill={EXAMPLE}", "--set", "judge.samples=3",
         "--set", "sim.judge_error=0.1", "-q")
    return db, tmp


def test_the_example_trains_from_its_own_evals_offline(trained):
    db, _ = trained
    s = _show(db, "notes")
    assert s["status"] == "completed"
    config = json.loads(call("log", "notes", "--json", "--db", db))[0]["payload"]["config"]
    assert config["env"] == "evals" and config["data"] is None and config["gate_metric"] == "soft"
    test = s["test"]
    assert set(test) == {"no_skill", "baseline", "best"}
    assert test["best"]["soft"] > test["baseline"]["soft"]  # the trained skill gains on test
    assert test["best"]["soft"] > test["no_skill"]["soft"]
    usage = s["usage"]
    assert usage["judge"]["calls"] == 3 * usage["target"]["calls"]  # every output graded three times
    assert s["grading"]["samples"] == 3 and s["grading"]["agreement"]["samples"] < 1  # the judge errs sometimes
    assert {row["kind"] for row in s["grading"]["rows"]} == {"expectation", "assertion"}


def test_it_passes_audit_and_replay_verify(trained):
    db, _ = trained
    call("audit", "notes", "--db", db)
    out = call("replay", "notes", "--verify", "--db", db)
    assert "re-execution reproduces all" in out


def test_its_export_installs_passes_skill_check_and_writes_gradings(trained):
    db, tmp = trained
    skills, gradings = tmp / "skills", tmp / "gradings"
    out = call("export", "notes", "--into", str(skills), "--grading", str(gradings), "--db", db)
    assert "skill-creator's layout" in out
    assert call("skill", "check", str(skills / "meeting-notes")).startswith("ok: meeting-notes")
    folders = sorted(p.name for p in (gradings).iterdir())
    assert folders and all(name.startswith("eval-") for name in folders)
    first = gradings / folders[0]
    assert sorted(p.name for p in first.iterdir()) == ["old_skill", "with_skill", "without_skill"]
    grading = json.loads((first / "with_skill" / "grading.json").read_text())
    assert set(grading["summary"]) == {"passed", "failed", "total", "pass_rate"}
    assert all(set(e) == {"text", "passed", "evidence"} for e in grading["expectations"])
    assert (first / "with_skill" / "outputs" / "output.md").exists()


def test_show_step_lists_every_check_with_its_verdict_and_evidence(trained):
    db, _ = trained
    out = call("show", "notes", "--step", "1", "--db", db)
    assert "verdict" in out and "evidence" in out
    assert "Every action item names the person who owns it." in out or "The notes" in out
    text = call("show", "notes", "--db", db)
    assert "no skill" in text and "checks on test" in text and "judge: 3 samples a verdict" in text


def test_eval_without_skill_scores_the_target_alone_on_the_same_evals(trained):
    db, _ = trained
    res = json.loads(call("eval", "--skill", str(EXAMPLE), "--without-skill", "--json", "--db", db,
                          "--set", "judge.samples=3", "--set", "sim.judge_error=0.1"))
    assert res["test"]["eval"]["soft"] == _show(db, "notes")["test"]["no_skill"]["soft"]
    assert res["usage"]["judge"]["sent"] == 0  # every call of it was made by the training run's test


def test_a_kill_during_grading_resumes_with_no_call_paid_twice(tmp_path):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    proc = start_driver(tmp_path, "grading", ["run", "--db", db, "--run-id", "k", "--epochs", "1", "--set",
                                              f"initial_skill={EXAMPLE}", "-q"], SWEEP_PAUSE_CALLS="7")
    assert kill_at_pause(tmp_path, "grading", proc) == "calls 7"
    store = Store(db)
    try:
        sent = [c.role for c in store.read_calls("k")]
        assert "judge" in sent and "target" in sent  # killed with grading under way
        call("resume", "k", "--db", db, "-q")
        assert_paid_once(store, "k")
    finally:
        store.close()
    assert _show(db, "k")["status"] == "completed"
    call("replay", "k", "--verify", "--db", db)


def test_a_fork_with_another_judge_regrades_with_it_and_reuses_the_targets_calls(trained, tmp_path):
    db, _ = trained
    copy = tmp_path / "f.db"
    shutil.copy(Path(db.removeprefix("sqlite:///")), copy)
    url = f"sqlite:///{copy}"
    call("fork", "notes", "step_2", "--run-id", "other-judge", "--set", "sim.judge_error=0.3", "--db", url)
    store = Store(url)
    try:
        paid = {(role, model): calls for role, model, calls, *_ in store.paid_by_model("other-judge")}
    finally:
        store.close()
    assert ("judge", "sim-judge-err0.3") in paid  # the new judge grades
    assert not any(role == "judge" and model != "sim-judge-err0.3" for role, model in paid)
    s = _show(url, "other-judge")
    assert paid.get(("target", "sim-target"), 0) < s["usage"]["target"]["calls"]  # target replies reused


def test_the_openai_client_against_sim_server_with_the_judge_on_its_own_endpoint(tmp_path, monkeypatch):
    from skillstate.cli.tools import sim_world_named

    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    with SimServer(sim_world_named(None, None, skill_dir=str(EXAMPLE))) as main, \
            SimServer(sim_world_named(None, None, skill_dir=str(EXAMPLE))) as judge:
        db = f"sqlite:///{tmp_path / 'o.db'}"
        call("run", "--db", db, "--run-id", "o", "--backend", "openai", "--model", "sim-model", "--base-url",
             main.base_url, "--set", f"judge.base_url={judge.base_url}", "--set", "judge.model=sim-judge",
             "--set", f"initial_skill={EXAMPLE}", "--epochs", "1", "-q")
        assert judge.calls.get("judge", 0) > 0 and main.calls.get("judge", 0) == 0
        assert main.calls["target"] > 0 and main.calls["optimizer"] > 0 and judge.calls.get("optimizer", 0) == 0
        assert judge.calls.get("target", 0) <= 1  # at most the start-up check that the endpoint answers
    s = _show(db, "o")
    assert s["status"] == "completed" and s["usage"]["judge"]["sent"] == judge.calls["judge"]
    call("replay", "o", "--verify", "--db", db)


def _skill_with(tmp_path: Path, evals: object, name: str = "s") -> Path:
    skill = tmp_path / name
    (skill / "evals").mkdir(parents=True)
    (skill / "SKILL.md").write_text(f"---\nname: {name}\ndescription: A test skill for evals.\n---\n# S\n")
    (skill / "evals" / "evals.json").write_text(evals if isinstance(evals, str) else json.dumps(evals))
    return skill


@pytest.mark.parametrize(("evals", "message"), [
    ({"evals": [{"id": 1, "prompt": "a", "expectations": ["x"]}, {"id": 2, "prompt": "b", "expectations": ["y"]}]},
     "needs at least 3 evals for train, val and test; the file has 2"),
    ("{not json", "not valid JSON"),
    ({"evals": [{"id": 1, "expectations": ["x"]}]}, "prompt"),
    ({"evals": [{"id": i, "prompt": f"p{i}", "assertions": [{"type": "command", "value": "true"}]}
                for i in range(3)]}, "workspace"),
    ({"evals": [{"id": i, "prompt": f"p{i}"} for i in range(3)]}, "nothing to grade"),
])
def test_evals_that_cannot_be_trained_on_are_refused_in_one_line(tmp_path, evals, message):
    skill = _skill_with(tmp_path, evals)
    db = f"sqlite:///{tmp_path / 'r.db'}"
    res = CliRunner().invoke(cli, ["run", "--db", db, "--set", f"initial_skill={skill}"])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "r.db").exists() or call("runs", "--db", db).count("run-") == 0  # nothing written


def test_env_evals_without_a_skill_directory_is_refused(tmp_path):
    res = CliRunner().invoke(cli, ["run", "--db", f"sqlite:///{tmp_path / 'n.db'}", "--env", "evals"])
    assert res.exit_code == 2 and "set initial_skill to a skill directory holding evals/evals.json" in res.output


def test_the_split_sizes_are_settable_and_the_same_for_the_same_seed(tmp_path):
    db = f"sqlite:///{tmp_path / 's.db'}"
    sizes = "env_config={split: [10, 7, 7]}"
    for run_id in ("a", "b"):
        call("run", "--db", db, "--run-id", run_id, "--set", f"initial_skill={EXAMPLE}", "--set", sizes,
             "--epochs", "1", "--set", "eval_test=false", "-q")
    starts = [json.loads(call("log", r, "--json", "--db", db))[0]["payload"]["dataset"] for r in ("a", "b")]
    assert starts[0] == starts[1]
    assert [starts[0][s]["count"] for s in ("train", "val", "test")] == [10, 7, 7]


def test_why_names_the_checks_whose_failures_led_to_an_edit(trained):
    db, _ = trained
    best = call("export", "notes", "--db", db)
    added = next(line for line in best.splitlines() if line.startswith("- ") and "check" in line.lower()
                 or line.startswith("- Always include") or line.startswith("- Make sure that"))
    out = call("why", "notes", added[2:40], "--db", db)
    assert "failed expectation (" in out or "failed assertion (" in out


def test_the_dashboard_shows_each_check_and_the_score_without_the_skill(trained):
    from starlette.testclient import TestClient

    from skillstate.dashboard.app import create_app

    db, _ = trained
    store = Store(db)
    try:
        with TestClient(create_app(store)) as client:
            run_page = client.get("/runs/notes").text
            assert 'id="no-skill"' in run_page and "Without the skill" in run_page
            step = client.get("/runs/notes/steps/1").text
            assert 'id="checks"' in step and "Evidence" in step
            item = json.loads(call("show", "notes", "--step", "1", "--json", "--db", db))["rollout"]["graded"][0]
            page = client.get(f"/runs/notes/items/{item['item_id']}?step=1").text
            assert 'id="checks"' in page and item["checks"][0]["text"].split("'")[0] in page
    finally:
        store.close()


def test_a_judge_whose_calls_fail_stops_the_run_and_never_passes_an_output(tmp_path, monkeypatch):
    from skillstate.cli.tools import sim_world_named
    from skillstate.sim.server import Fault

    def judge_fails(n, path, body):
        grading = any("<expectations>" in str(m.get("content")) for m in body.get("messages", []))
        return Fault(status=500, body='{"error": {"message": "judge down"}}') if grading else None

    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    db = f"sqlite:///{tmp_path / 'f.db'}"
    with SimServer(sim_world_named(None, None, skill_dir=str(EXAMPLE))) as main, \
            SimServer(sim_world_named(None, None, skill_dir=str(EXAMPLE)), fault=judge_fails) as judge:
        res = CliRunner().invoke(cli, ["run", "--db", db, "--run-id", "down", "--backend", "openai", "--model",
                                       "sim-model", "--base-url", main.base_url, "--set",
                                       f"judge.base_url={judge.base_url}", "--set", "judge.max_retries=0",
                                       "--set", f"initial_skill={EXAMPLE}", "-q"])
    assert res.exit_code not in (0, 2), res.output
    assert "judge" in res.output and "Traceback" not in res.output
    s = _show(db, "down")
    assert s["status"] != "completed" and s["baseline_score"] is None  # nothing was scored on failed verdicts


def test_the_paired_gate_works_on_graded_outcomes(tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    call("run", "--db", db, "--run-id", "paired", "--set", f"initial_skill={EXAMPLE}", "--set", "gate_rule=paired",
         "--epochs", "2", "-q")
    assert _show(db, "paired")["status"] == "completed"


def test_with_disclosure_the_trigger_evals_score_the_description_and_train_it(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    call("run", "--db", db, "--run-id", "t", "--set", f"initial_skill={EXAMPLE}", "--set", "disclosure=tools", "-q")
    start = json.loads(call("log", "t", "--json", "--db", db))[0]["payload"]
    triggers = json.loads((EXAMPLE / "evals" / "trigger_evals.json").read_text())
    assert sum(info["count"] for info in start["dataset"].values()) == 24 + len(triggers)  # the evals and triggers
    s = _show(db, "t")
    assert s["status"] == "completed" and s["triggers"]  # recall and precision per skill, as disclosure reports
    step = json.loads(call("show", "t", "--step", "1", "--json", "--db", db))
    checks = [c for g in step["rollout"]["graded"] if g["item_id"].startswith("trigger-") for c in g["checks"]]
    assert checks and {c["kind"] for c in checks} == {"trigger"}
    assert {c["text"] for c in checks} <= {"uses the skill", "does not use the skill"}
    described = [line for n in range(1, 5) for line in call("show", "t", "--step", str(n), "--db", db).splitlines()
                 if line.strip().startswith("describe:")]
    assert described  # a trigger eval the skill missed led the analysts to widen the description
    call("replay", "t", "--verify", "--db", db)


def test_without_disclosure_the_trigger_evals_are_left_out(trained):
    db, _ = trained
    start = json.loads(call("log", "notes", "--json", "--db", db))[0]["payload"]
    assert sum(info["count"] for info in start["dataset"].values()) == 24
