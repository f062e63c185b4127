"""The rough edges a new user hits: one test per item of the issue. Every user
error is one line on stderr, exit code 2, no traceback, and the database is
left as it was (file not created, tables unchanged, no new run)."""

from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from skillstate.cli.main import cli
from skillstate.errors import UserError
from skillstate.storage.migrate import head_revision

QA = ["--data", "examples/qa"]
FAST = ["--epochs", "1", "--batch-size", "12", "-q", *QA]


def invoke(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def ok(*args, env=None):
    res = invoke(*args, env=env)
    assert res.exit_code == 0, res.output
    return res.output


def error(*args, code=2, match="", env=None) -> str:
    res = invoke(*args, env=env)
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert match in lines[0], lines[0]
    return lines[0]


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def tables(path: Path) -> list[tuple]:
    """The schema of a SQLite file, read without skillstate."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def run_ids(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
    finally:
        conn.close()


def copy_db(src: Path, dst: Path) -> Path:
    """A consistent copy of a database in WAL mode (the backup API, not a file copy)."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    return dst


@pytest.fixture(scope="module")
def base_db(tmp_path_factory) -> Path:
    """A training run `demo` and, made after it, an evaluation run `ev`."""
    folder = tmp_path_factory.mktemp("rough")
    path = folder / "base.db"
    ok("run", "--run-id", "demo", *FAST, "--db", url(path))
    skill = folder / "skill.md"
    skill.write_text("# Skill\n\nAnswer briefly.\n")
    ok("eval", "--skill", skill, "--run-id", "ev", *QA, "-q", "--db", url(path))
    return path


@pytest.fixture
def db(base_db, tmp_path) -> Path:
    """A private copy of `base_db` for a test that may write."""
    return copy_db(base_db, tmp_path / "copy.db")


# 1 ---------------------------------------------------------------------------------------------------------------


def test_1_a_real_model_or_a_base_url_means_backend_openai_and_sim_refuses_them(db, sim_server, tmp_path):
    before = run_ids(db)
    # no backend anywhere: a real model name means openai (here: no API key, so it stops before any run)
    error("run", "--model", "gpt-4o-mini", *QA, "--db", url(db), env={"OPENAI_API_KEY": None},
          match="set OPENAI_API_KEY")
    error("eval", "--skill", "README.md", "--model", "gpt-4o-mini", *QA, "--db", url(db),
          env={"OPENAI_API_KEY": None}, match="set OPENAI_API_KEY")
    # a base URL the client cannot parse: one line, no run (a fork, which probes no endpoint, included)
    error("run", "--model", "gpt-4o-mini", "--base-url", "http://[::1", *QA, "--db", url(db),
          env={"OPENAI_API_KEY": "local"}, match="target.base_url 'http://[::1' is not a usable URL")
    error("fork", "demo", "1", "--set", "backend=openai", "--set", "target.model=m", "--set",
          "target.base_url=http://x:port/v1", "--db", url(db), env={"OPENAI_API_KEY": "local"},
          match="is not a usable URL")
    # backend sim chosen explicitly, with a real model or a base URL: refused
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("backend: sim\ntarget:\n  model: gpt-4o\n")
    for args in (["--backend", "sim", "--model", "gpt-4o-mini"], ["--set", "backend=sim", "--base-url", "http://x/v1"],
                 ["--config", cfg], ["--backend", "sim", "--target-model", "llama3.1"]):
        error("run", *args, "--db", url(db), match="the offline simulator cannot call")
    error("eval", "--skill", "README.md", "--backend", "sim", "--model", "gpt-4o", "--db", url(db),
          match="the offline simulator cannot call model 'gpt-4o'")
    error("run", "--run-id", "demo", "--base-url", "http://x/v1", "--db", url(db),
          match="run 'demo' uses backend sim: the offline simulator cannot call base URL http://x/v1")
    error("fork", "demo", "1", "--set", "target.model=gpt-4o", "--db", url(db),
          match="run 'demo' uses backend sim: the offline simulator cannot call model 'gpt-4o'; use --set backend")
    assert run_ids(db) == before
    # with a base URL and no backend, the calls go to that endpoint
    env = {"OPENAI_API_KEY": "local"}
    ok("run", "--run-id", "inferred", "--model", "gpt-4o-mini", "--base-url", sim_server.base_url, *FAST,
       "--db", url(db), env=env)
    first = json.loads(ok("log", "inferred", "--json", "--db", url(db)))[0]
    assert first["payload"]["config"]["backend"] == "openai" and sim_server.requests > 0
    sent = sim_server.requests
    ok("eval", "--skill", "README.md", "--run-id", "ev2", "--base-url", sim_server.base_url, "--model", "sim",
       *QA, "-q", "--db", url(db), env=env)
    assert sim_server.requests > sent
    # the sim names stay on the simulator
    ok("eval", "--skill", "README.md", "--run-id", "ev3", "--backend", "sim", "--model", "sim-target", *QA, "-q",
       "--db", url(db))


# 2 ---------------------------------------------------------------------------------------------------------------


def test_2_the_most_recent_run_is_the_most_recent_training_run(db, tmp_path):
    d = url(db)
    assert run_ids(db) == ["demo", "ev"]  # ev is the newest
    assert json.loads(ok("replay", "--to-step", "0", "--json", "--db", d))["run_id"] == "demo"
    assert json.loads(ok("show", "--json", "--db", d))["run_id"] == "demo"
    assert ok("export", "--db", d) == ok("export", "demo", "--db", d)
    assert ok("diff", "0", "1", "--db", d) == ok("diff", "demo", "0", "1", "--db", d)
    assert "run demo:" in ok("why", "Question answering", "--db", d)
    assert json.loads(ok("resume", "-q", "--json", "--db", d))["run_id"] == "demo"
    assert json.loads(ok("show", "ev", "--json", "--db", d))["kind"] == "eval"  # named, an eval run is read
    # errors about a run name it
    error("replay", "--to-step", "99", "--db", d, match="step 99 is beyond the end of run 'demo'")
    error("diff", "0", "99", "--db", d, match="run 'demo'")
    error("export", "--step", "99", "--db", d, match="run 'demo'")
    error("fork", "99", "--db", d, match="run 'demo'")
    fork = json.loads(ok("fork", "1", "--no-run", "--json", "--run-id", "kid", "--db", d))
    assert fork["parent_run_id"] == "demo"
    # a database with only evaluation runs
    only_eval = tmp_path / "eval.db"
    ok("eval", "--skill", "README.md", "--run-id", "e1", *QA, "-q", "--db", url(only_eval))
    for cmd in (["show"], ["replay", "--to-step", "0"], ["export"], ["resume"], ["fork", "0"], ["why", "x"]):
        error(*cmd, "--db", url(only_eval), match="no training runs in")
    assert run_ids(only_eval) == ["e1"]


# 3 ---------------------------------------------------------------------------------------------------------------


READ_COMMANDS = (["runs"], ["log"], ["show"], ["replay", "--to-step", "0"], ["audit"], ["export"], ["diff", "0", "1"],
                 ["why", "x"])


def test_3_read_commands_do_not_create_a_database(tmp_path):
    missing = tmp_path / "nope.db"
    for cmd in READ_COMMANDS:
        error(*cmd, "--db", url(missing), match=f"no database at {missing}")
        assert not missing.exists(), cmd
    empty = tmp_path / "empty.db"
    empty.touch()
    for cmd in READ_COMMANDS:
        if cmd != ["audit"]:  # audit opens the store in its own body (see the report)
            error(*cmd, "--db", url(empty), match="is an empty database")
    assert empty.stat().st_size == 0
    error("db", "check", "--db", url(missing), match="no database at")
    assert not missing.exists()


def test_3_someone_elses_database_is_refused_by_every_command(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE people (id INTEGER, name TEXT)")
    schema, mode = tables(other), sqlite3.connect(other).execute("PRAGMA journal_mode").fetchone()
    for cmd in (*READ_COMMANDS, ["run", *FAST], ["eval", "--skill", "README.md", *QA], ["fork", "0"], ["resume"],
                ["db", "upgrade"], ["db", "check"]):
        error(*cmd, "--db", url(other), match="is not a skillstate database (it has other tables: people)")
    assert tables(other) == schema
    assert sqlite3.connect(other).execute("PRAGMA journal_mode").fetchone() == mode  # not switched to WAL
    assert not Path(f"{other}-wal").exists()


def test_3_a_damaged_or_unversioned_schema_is_named(db, tmp_path):
    unversioned = copy_db(db, tmp_path / "unversioned.db")
    with sqlite3.connect(unversioned) as conn:
        conn.execute("DROP TABLE alembic_version")
    schema = tables(unversioned)
    for cmd in (["runs"], ["run", *FAST], ["db", "upgrade"], ["db", "check"]):
        error(*cmd, "--db", url(unversioned), match="no alembic_version table")
    assert tables(unversioned) == schema
    no_events = copy_db(db, tmp_path / "no_events.db")
    with sqlite3.connect(no_events) as conn:
        conn.execute("DROP TABLE events")
    schema = tables(no_events)
    for cmd in (["db", "upgrade"], ["db", "check"], ["show"], ["run", *FAST]):
        error(*cmd, "--db", url(no_events), match="is damaged: table events is missing")
    no_mac = copy_db(db, tmp_path / "no_mac.db")
    with sqlite3.connect(no_mac) as conn:
        conn.execute("ALTER TABLE events DROP COLUMN mac")
    error("db", "check", "--db", url(no_mac), match="column events.mac is missing")
    assert tables(no_events) == schema and "table events is missing" in error("db", "upgrade", "--db", url(no_events))
    assert f"the skillstate schema is fine (revision {head_revision()})" in ok("db", "check", "--db", url(db))


# 4 ---------------------------------------------------------------------------------------------------------------


def test_4_run_ids_are_letters_digits_dot_underscore_dash(db):
    d = url(db)
    before = run_ids(db)
    for bad in ("a\nb", "demo\n", "a b", "x" * 129, "ü", "a/b", ""):
        error("run", "--run-id", bad, *FAST, "--db", d, match="invalid run id")
    error("fork", "demo", "0", "--run-id", "new\nline", "--db", d, match="invalid run id 'new\\nline'")
    error("eval", "--skill", "README.md", "--run-id", "tab\tbed", "--db", d, match="invalid run id")
    assert run_ids(db) == before
    # the library refuses them too, before anything is written
    from skillstate.config import SkillConfig
    from skillstate.engine.runner import create_run, fork_run
    from skillstate.storage.store import GENESIS, Store

    store = Store(d)
    try:
        with pytest.raises(UserError, match="invalid run id"):
            store.create_run("a\nb")
        with pytest.raises(UserError, match="invalid run id"):
            store.append("", [], last_seq=0, last_hash=GENESIS, new_run={})
        with pytest.raises(UserError, match="invalid run id"):
            create_run(store, SkillConfig(data="examples/qa"), "bad id")
        with pytest.raises(UserError, match="invalid run id"):
            fork_run(store, "demo", 0, {}, "x" * 129, probe=False)
        assert fork_run(store, "demo", 0, {}, "Ok.id_1-2", probe=False) == "Ok.id_1-2"
    finally:
        store.close()
    assert run_ids(db) == sorted([*before, "Ok.id_1-2"])


# 5 ---------------------------------------------------------------------------------------------------------------


def test_5_run_on_an_evaluation_run_says_so(db):
    events = json.loads(ok("log", "ev", "--json", "--db", url(db)))
    error("run", "--run-id", "ev", "--db", url(db), match="run 'ev' is an evaluation run")
    assert json.loads(ok("log", "ev", "--json", "--db", url(db))) == events


# 6 ---------------------------------------------------------------------------------------------------------------


def test_6_eval_refuses_an_empty_skill_file(db, tmp_path):
    before = run_ids(db)
    for text in ("", "  \n\n\t\n"):
        skill = tmp_path / "empty.md"
        skill.write_text(text)
        error("eval", "--skill", skill, "--db", url(db), match=f"skill file {skill} is empty")
    assert run_ids(db) == before


# 7 ---------------------------------------------------------------------------------------------------------------


def test_7_why_text_that_is_not_in_the_skill_is_a_user_error(base_db):
    """Issue 41, item 12: a text the run never had is a user error like an unknown run (exit 2, one line)."""
    d = url(base_db)
    error("why", "zzz", "--db", d, code=2, match="'zzz' is not in the best skill of run demo")
    res = invoke("why", "demo", "zzz", "--json", "--db", d)
    assert res.exit_code == 2 and json.loads(res.output[: res.output.rindex("}") + 1])["found"] is False
    assert "is in the" in ok("why", "Question answering", "--db", d)  # text that is there: exit 0


# 8 ---------------------------------------------------------------------------------------------------------------


def test_8_diff_with_one_step_and_fork_at_a_negative_step(db):
    d = url(db)
    before = run_ids(db)
    error("diff", "demo", "3", "--db", d, match="diff needs two steps: got run 'demo' and one step '3'")
    error("diff", "demo", "-1", "1", "--db", d, match="not a step: '-1'")
    x = error("fork", "demo", "step_x", "--db", d, match="not a step: 'step_x'")
    y = error("fork", "demo", "-1", "--db", d, match="not a step: '-1' (steps are 0 or more)")
    assert x.split(":")[0] == y.split(":")[0]
    error("fork", "demo", "1", "--lrr", "2", "--db", d, match="no such option: --lrr")
    assert run_ids(db) == before


# 9 ---------------------------------------------------------------------------------------------------------------


def test_9_sim_server_bad_port_is_one_line():
    for port in ("-1", "70000"):
        error("sim-server", "--port", port, match="--port must be 0 to 65535")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        error("sim-server", "--port", port, match=f"cannot serve on 127.0.0.1:{port}")


# 10 --------------------------------------------------------------------------------------------------------------


def test_10_database_problems_exit_2(db, tmp_path):
    not_db = tmp_path / "notes.db"
    not_db.write_text("these are my notes, not a database\n" * 20)
    data = not_db.read_bytes()
    for cmd in (["runs"], ["show"], ["run", *FAST], ["db", "upgrade"], ["db", "check"]):
        error(*cmd, "--db", url(not_db), match="file is not a database")
    assert not_db.read_bytes() == data
    malformed = copy_db(db, tmp_path / "malformed.db")
    with open(malformed, "r+b") as f:  # every page but the first (the schema) overwritten
        f.seek(4096)
        f.write(b"\xa5" * (malformed.stat().st_size - 4096))
    for cmd in (["runs"], ["show", "demo"], ["run", *FAST], ["db", "check"]):
        error(*cmd, "--db", url(malformed), match="database disk image is malformed")
    read_only = f"sqlite:///file:{db}?mode=ro&uri=true"
    before = run_ids(db)
    for cmd in (["run", *FAST], ["fork", "demo", "0"], ["resume", "demo"]):
        error(*cmd, "--db", read_only, match="is read-only")
    assert "demo" in ok("runs", "--db", read_only)  # reading a read-only database is fine
    assert run_ids(db) == before


# 11 --------------------------------------------------------------------------------------------------------------


def test_11_fork_and_resume_print_json_with_the_run_id(db):
    d = url(db)
    out = json.loads(ok("fork", "demo", "0", "--run-id", "child", "-q", "--json", "--db", d))
    assert out["run_id"] == "child" and out["parent_run_id"] == "demo" and out["status"] == "completed"
    kid = json.loads(ok("fork", "demo", "1", "--no-run", "--json", "--db", d))
    assert kid["run_id"].startswith("fork-") and kid["fork_step"] == 1
    resumed = json.loads(ok("resume", kid["run_id"], "--json", "--db", d))
    assert resumed["run_id"] == kid["run_id"] and resumed["status"] == "completed"


def test_migration_0003_marks_evaluation_runs_recorded_as_training_runs(tmp_path):
    from sqlalchemy import text as sql

    from skillstate.storage.store import Store

    db = url(tmp_path / "old.db")
    skill = tmp_path / "s.md"
    skill.write_text("# Skill\nAnswer briefly.\n")
    assert CliRunner().invoke(cli, ["eval", "--skill", str(skill), "--run-id", "ev", "-q", "--db", db]).exit_code == 0
    store = Store(db)
    with store.engine.begin() as conn:  # as a database written before 0003 holds it
        conn.execute(sql("UPDATE runs SET kind = 'train'"))
        conn.execute(sql("UPDATE alembic_version SET version_num = '0002'"))
    store.close()
    store = Store(db)
    assert store.get_run("ev").kind == "eval" and store.latest_run_id() is None
    store.close()
