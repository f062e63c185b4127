"""What a newcomer met (issue 41): one test per defect, named by its item number. Each failed
before its fix."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import small_config

from skillstate.cli.main import cli
from skillstate.storage.store import Store
from skillstate.trainer import Trainer


def invoke(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def one_error_line(res, code: int = 2) -> str:
    assert res.exit_code == code, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in res.output, res.output
    return lines[0]


# 2 ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bank_db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('bank') / 'b.db'}"
    store = Store(url)
    Trainer(small_config(mode="bank", num_epochs=1), store=store, run_id="b").train()
    store.close()
    return url


def test_2_why_names_the_split_an_evolved_skills_failures_came_from(bank_db):
    from skillstate.engine.runner import lineage_events

    store = Store(bank_db)
    evolved = [s.event for s in lineage_events(store, "b") if s.type == "BankEvolved" and s.event.added]
    store.close()
    assert evolved and all(ev.source == "train" for ev in evolved)  # bank.evolve_from's default
    skill = evolved[0].added[0]
    res = invoke("why", "b", skill.id, "--json", "--db", bank_db)
    assert res.exit_code == 0, res.output
    (info,) = json.loads(res.output)["skills"]
    assert info["trajectories"] and info["origin"] == "evolve"
    rollout = next(s.event for s in lineage_events(Store(bank_db), "b")
                   if s.type == "RolloutCompleted" and s.event.step == evolved[0].step)
    how = {r.item_id: r.fail_reason for r in rollout.results}
    for t in info["trajectories"]:  # a failure of the step's own rollout on train, as it failed there
        assert t["outcome"] == f"failed on train ({how[t['id']]})", t
    text = invoke("why", "b", skill.id, "--db", bank_db).output
    assert "failed on train" in text and "validation" not in text


# 10 --------------------------------------------------------------------------------------------------------------


def test_10_why_shows_a_multi_line_edit_indented_and_cuts_at_a_word():
    from skillstate.cli.render import why_text

    content = "# Arithmetic\n\n- Multiply and divide before adding.\n- Then add and subtract, left to right.\n"
    info = {"run_id": "r", "text": "Arithmetic", "in_initial_skill": False, "in_current_skill": True,
            "in_best_skill": True, "changes": [{"change": "added", "step": 3, "epoch": 1, "decision": "accept_best",
                                                "reason": "0.9 > best 0.6", "by": "step"}],
            "origin": {"step": 3, "method": "patch",
                       "kept_edits": [{"op": "create", "file": "references/arithmetic.md", "target": "",
                                       "content": content, "source": "failure", "support": 8,
                                       "status": "applied"}],
                       "proposed_by": [{"source": "failure", "minibatch": 0, "failure_summary": [],
                                        "reasoning": "word " * 200, "items": []}]}}
    lines = why_text(info, width=80).splitlines()
    at = next(i for i, line in enumerate(lines) if "[applied] create" in line)
    assert "references/arithmetic.md" in lines[at] and lines[at].endswith(":")
    body = lines[at + 1: at + 5]
    assert [line.strip() for line in body] == content.strip("\n").splitlines()
    assert all(line.startswith("      ") for line in body if line)  # under the edit, not at the margin
    reasoning = " ".join(line.strip() for line in lines if "reasoning:" in line or line.startswith("    word"))
    assert reasoning.endswith("word…") and "wor…" not in reasoning
    assert all(len(line) <= 80 for line in lines)


# 6 ---------------------------------------------------------------------------------------------------------------


def test_6_show_marks_the_bound_of_a_candidate_rejected_early(finished_run):
    from skillstate.engine.loading import load_run
    from skillstate.reading.history import early_rejects

    store, _result, _rec = finished_run
    bounds = early_rejects(load_run(store, "base"))
    assert bounds, "the small run has no early reject to show"
    db = ["--db", store.display_url]
    out = invoke("show", "base", *db, env={"COLUMNS": "100"}).output.splitlines()
    rows = {int(line.split()[0]): line.split() for line in out if line.strip()[:1].isdigit()}
    for step, row in rows.items():
        marked = row[4].startswith("≤")
        assert marked == (step in bounds), row
        if marked:
            assert float(row[4][1:]) == pytest.approx(bounds[step]["upper_bound"], abs=5e-4)
    assert any(line.startswith("≤: rejected early") for line in out)
    step = min(bounds)
    detail = invoke("show", "base", "--step", step, *db, env={"COLUMNS": "200"}).output
    b = bounds[step]
    assert f"rejected early after {b['scored']} of {b['of']} items, at most {b['upper_bound']:.3f}" in detail


# 11 --------------------------------------------------------------------------------------------------------------


def test_11_output_that_is_not_a_terminal_is_not_cut(finished_run):
    """Off a terminal without $COLUMNS (a pipe, a file): every edit of `show --step N` whole, no ellipsis."""
    from skillstate.engine.loading import load_run
    from skillstate.reading.step_detail import step_detail

    store, _result, _rec = finished_run
    loaded = load_run(store, "base")
    step, kept = next((s, d["selected"]["edits"]) for s in range(1, 7)
                      if (d := step_detail(store, loaded, s)).get("selected", {}).get("edits"))
    res = invoke("show", "base", "--step", step, "--db", store.display_url, env={"COLUMNS": None})
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    for edit in kept:
        assert " ".join((edit["content"] or edit["target"]).split()) in res.output
    narrow = invoke("show", "base", "--step", step, "--db", store.display_url, env={"COLUMNS": "60"}).output
    assert all(len(line) <= 60 for line in narrow.splitlines())  # $COLUMNS, when set, is still the width


# 4 ---------------------------------------------------------------------------------------------------------------


def test_4_the_dashboards_step_0_is_the_baseline(finished_run):
    from html import unescape

    from starlette.testclient import TestClient

    from skillstate.dashboard.app import create_app
    from skillstate.dashboard.store_view import open_read_only
    from skillstate.engine.loading import load_run
    from skillstate.reading.step_zero import step_zero

    store, _result, _rec = finished_run
    zero = step_zero(store, load_run(store, "base"))["baseline"]
    view = open_read_only(store.display_url)
    try:
        with TestClient(create_app(view, allowed_hosts=["testserver"])) as client:
            for url in ("/runs/base/steps/0", "/runs/base/steps/step_0"):
                page = client.get(url)
                assert page.status_code == 200, page.text[:300]
            html = unescape(page.text)
            assert "the baseline" in html and f"gate {zero['gate']:.3f}" in html
            assert all(f["item_id"] in html for f in zero["failures"])
            assert 'href="/runs/base/steps/1"' in html  # on to step 1
            assert 'href="/runs/base/steps/0"' in client.get("/runs/base").text  # the run page links to it
            assert 'href="/runs/base/steps/0"' in client.get("/runs/base/steps/1").text  # and step 1 back to it
    finally:
        view.close()


# 7 ---------------------------------------------------------------------------------------------------------------


def test_7_every_export_that_writes_says_what_and_where(finished_run, bank_db, tmp_path):
    import re

    store, _result, _rec = finished_run
    db = ["--db", store.display_url]
    cases = [
        (["export", "base", "-o", tmp_path / "skill.md", *db], tmp_path / "skill.md",
         "the best skill of run base as markdown"),
        (["export", "base", "--step", "2", "-o", tmp_path / "s2.md", *db], tmp_path / "s2.md",
         "the skill of run base after step 2 as markdown"),
        (["export", "b", "--format", "skillrl", "-o", tmp_path / "bank.json", "--db", bank_db], tmp_path / "bank.json",
         "the best bank of run b as SkillRL's bank JSON"),
    ]
    for args, path, what in cases:
        res = invoke(*args)
        assert res.exit_code == 0, res.output
        assert res.output.splitlines() == [res.output.strip()] and res.output.startswith(f"wrote {path}: {what}")
        assert path.is_file()
    res = invoke("export", "b", "--into", tmp_path / "bank", "--db", bank_db)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines and all(line.startswith(f"wrote {tmp_path / 'bank'}/") for line in lines)
    assert not re.search(r"\b1 files\b", res.output) and "(1 file)" in res.output
    assert invoke("export", "base", *db).output.startswith("# ")  # to stdout: the skill alone, no note


# 8 ---------------------------------------------------------------------------------------------------------------


def test_8_skill_check_refuses_a_file_that_is_not_a_markdown_skill(tmp_path):
    from conftest import EXAMPLES

    line = one_error_line(invoke("skill", "check", EXAMPLES / "qa" / "train.jsonl"))
    assert "train.jsonl: not a skill" in line and "markdown file (.md)" in line
    data = tmp_path / "data.md"
    data.write_text('{"question": "2+2?", "answer": "4"}\n{"question": "3+3?", "answer": "6"}\n')
    assert "holds JSON, not a markdown skill" in one_error_line(invoke("skill", "check", data))
    res = invoke("skill", "check", EXAMPLES / "qa" / "train.jsonl", "--json")
    assert res.exit_code == 2 and json.loads(res.output)["ok"] is False
    plain = tmp_path / "answers.md"
    plain.write_text("# Skill\n\nAnswer briefly.\n")
    res = invoke("skill", "check", plain)
    assert res.exit_code == 0 and "a plain markdown skill" in res.output


# 3 ---------------------------------------------------------------------------------------------------------------


def test_3_an_external_agents_skill_loads_are_said_to_be_unobserved_not_zero():
    """An external agent reads its skills through its own tools (bash): the run sees no load, so it must not
    report a recall of 0.000 and warn that the endpoint serves no tool calls."""
    from conftest import EXAMPLES

    from skillstate.cli.notes import trigger_lines
    from skillstate.config_sources import build_config
    from skillstate.config_views import public_config
    from skillstate.reading.triggers import unobserved_loads

    shell = public_config(build_config(EXAMPLES / "agents" / "shell-agent.yaml"))
    assert unobserved_loads(shell) == "command"
    builtin = {**shell, "env_config": {**shell["env_config"], "harness": {"kind": "builtin"}}}
    assert unobserved_loads(builtin) is None and unobserved_loads({**shell, "disclosure": "inline"}) is None
    zero = {"split": "val", "rollouts": 6, "recall": 0.0, "precision": None, "loads": 0, "wrong_loads": 0,
            "by_task_type": {}, "files_read": {}}
    text = "\n".join(trigger_lines({"triggers_unobserved": "command", "triggers": {"baseline": zero}}, 100))
    assert "not observed" in text and "harness command" in text
    assert "0.000" not in text and "never loaded" not in text and "tool calls" not in text
    observed = "\n".join(trigger_lines({"triggers": {"baseline": zero}}, 100))  # builtin agent: still warned
    assert "never loaded a skill" in observed


# 14 --------------------------------------------------------------------------------------------------------------


def test_14_the_progress_bar_names_a_stage_as_its_line_does(tmp_path, capsys):
    """An evaluation's bar said `eval_skill` where its line says `eval`."""
    import io
    import re

    from rich.console import Console

    from skillstate.cli.live import LiveProgress, reporter
    from skillstate.trainer import evaluate_skill

    skill = tmp_path / "skill.md"
    skill.write_text("# Answer\nAnswer in one word.\n", encoding="utf-8")
    screen = io.StringIO()
    live = reporter(console=Console(file=screen, force_terminal=True, width=120))
    assert isinstance(live, LiveProgress)
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    with live:
        evaluate_skill(small_config(initial_skill=str(skill)), store=store, on_progress=live)
    store.close()
    bars = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert re.search(r"  eval +\S*━", bars) and "eval_skill" not in bars
    assert any(line.startswith("eval ") for line in capsys.readouterr().out.splitlines())


def test_14_a_missing_extra_names_the_install_command_of_a_checkout(tmp_path, monkeypatch):
    """From a checkout (an editable install), `pip install "skillstate[train]"` would fetch skillstate from PyPI
    over the checkout: the hint is `pip install -e ".[train]"`, run in the checkout."""
    from pathlib import Path

    from skillstate.util import install_hint

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)
    assert install_hint("train") == 'pip install -e ".[train]"'
    monkeypatch.chdir(tmp_path)
    assert install_hint("train") == f'pip install -e "{root}[train]"'
    from skillstate.engine.policy_model import TRAIN_EXTRA

    assert TRAIN_EXTRA.startswith("pip install -e ")


# 15 --------------------------------------------------------------------------------------------------------------


def test_15_an_env_module_that_exits_when_imported_is_an_error(tmp_path, monkeypatch):
    for code in (0, 3):
        (tmp_path / f"exits{code}.py").write_text(f"import sys\nsys.exit({code})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    db = f"sqlite:///{tmp_path / 'x.db'}"
    for code in (0, 3):
        line = one_error_line(invoke("run", "--env", f"python:exits{code}:X", "-q", "--db", db))
        assert f"importing exits{code} called sys.exit({code})" in line
    assert not (tmp_path / "x.db").exists() or "run-" not in invoke("runs", "--db", db).output


def test_15_db_upgrade_refuses_a_damaged_file(tmp_path):
    import shutil
    import sqlite3

    path = tmp_path / "s.db"
    assert invoke("run", "--epochs", "1", "--batch-size", "12", "-q", "--db", f"sqlite:///{path}").exit_code == 0
    with sqlite3.connect(path) as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    for page in range(pages // 2, pages):  # scribble over a page in the middle that SQLite's check sees
        damaged = tmp_path / "d.db"
        shutil.copy(path, damaged)
        with damaged.open("r+b") as fh:
            fh.seek(page * size + 8)
            fh.write(b"\xab" * (size // 2))
        with sqlite3.connect(damaged) as conn:
            if conn.execute("PRAGMA quick_check(1)").fetchone()[0] != "ok":
                break
    else:
        pytest.fail("no scribbled page was found damaged")
    before = damaged.read_bytes()
    line = one_error_line(invoke("db", "upgrade", "--db", f"sqlite:///{damaged}"))
    assert f"the database file of sqlite:///{damaged} is damaged" in line and "latest revision" not in line
    assert damaged.read_bytes() == before  # nothing written
    ok = invoke("db", "upgrade", "--db", f"sqlite:///{path}")
    assert ok.exit_code == 0 and "is at the latest revision" in ok.output


# 13 --------------------------------------------------------------------------------------------------------------

# What a command that only reads a run needs: the store, the events and their fold. Not the engine that runs
# one (stages, executors), nor the environments, nor the LLM clients, nor the migrations.
NOT_FOR_READING = ["skillstate.engine.runner", "skillstate.engine.stages", "skillstate.engine.context",
                   "skillstate.envs.registry", "skillstate.envs.qa", "skillstate.prompts", "alembic", "openai",
                   "anthropic", "httpx", "numpy", "jinja2", "starlette"]

NOT_FOR_LISTING = [*NOT_FOR_READING, "skillstate.config", "skillstate.pricing", "skillstate.skilltree", "yaml",
                   "skillstate.cli.render", "skillstate.reading.tool_use"]

READ_PROBE = """
import json, sys
from click.testing import CliRunner
from skillstate.cli.main import cli
result = CliRunner().invoke(cli, json.loads(sys.argv[1]))
assert result.exit_code == 0, result.output
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def test_13_reading_a_run_imports_no_engine_environment_or_client(finished_run):
    """`runs`, `show`, `show --step N` and `log` start fast: they import what reading a run needs and nothing of
    the engine (docs/benchmarks.md records the times; bench/bench_startup.py measures them)."""
    import subprocess
    import sys

    store, _result, _rec = finished_run
    db = ["--db", store.display_url]
    # listing runs and their events folds each run and prints a table: no summary, so no config model, prices,
    # skill trees (nor the YAML they read) and no summary renderer (NOT_FOR_LISTING holds NOT_FOR_READING)
    assert set(NOT_FOR_READING) <= set(NOT_FOR_LISTING)
    probes = [(["show", "base"], NOT_FOR_READING), (["show", "base", "--step", "1"], NOT_FOR_READING),
              (["show", "base", "--step", "0"], NOT_FOR_READING), (["runs"], NOT_FOR_LISTING),
              (["log", "base"], NOT_FOR_LISTING)]
    # each command in a fresh process of its own, the processes at once
    running = [(args, subprocess.Popen([sys.executable, "-c", READ_PROBE, json.dumps(args + db), json.dumps(not_for)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
               for args, not_for in probes]
    for args, proc in running:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (args, err)
        assert json.loads(out.strip().splitlines()[-1]) == [], args
