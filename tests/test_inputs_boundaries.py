"""Issue 20, section 5: what crosses a boundary into skillstate is checked
there. An environment's scores and types, an environment that cannot be
built, someone else's SQLite file, a corrupted one, a PostgreSQL port that
never answers, a dashboard port in use, Ctrl-C during an evaluation: each is
one line on stderr with its own exit code, no traceback, and nothing
half-written (no unreadable event, no changed foreign file, no run left
behind)."""

from __future__ import annotations

import json
import math
import sqlite3
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from skillstate.cli.main import cli
from skillstate.util import canonical_json

QA = ["--data", str(EXAMPLES / "qa")]
FAST = ["--epochs", "1", "--batch-size", "12", "-q", *QA]


def invoke(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def one_line(res, code: int, match: str) -> str:
    """The command failed with `code`, printing one line that holds `match` and no traceback."""
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert match in lines[0], lines[0]
    return lines[0]


def run_ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchall():
            return []
        return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
    finally:
        conn.close()


def event_types(path: Path, run_id: str) -> list[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return [r[0] for r in conn.execute("SELECT type FROM events WHERE run_id = ? ORDER BY seq", (run_id,))]


# 1. What an environment returns -------------------------------------------------------------------------------

BAD_ENVS = '''
from skillstate.envs import QAEnv
from skillstate.envs.episode import Turn
from rooms_env import RoomsEnv


def scoring(hard, soft):
    class Env(QAEnv):
        def score(self, prediction, item):
            return hard, soft, ""
    return Env


NanSoft = scoring(0.0, float("nan"))
InfHard = scoring(float("inf"), 0.0)
Above = scoring(1.5, 0.5)
Below = scoring(0.0, -0.5)
TextHard = scoring("1", 0.5)
NoSoft = scoring(0.0, None)
ListSoft = scoring(0.0, [0.5])


class NotAnOutcome(QAEnv):
    def rollout(self, skill, item, complete, prompts):
        return {"hard": 1.0, "soft": 1.0}


class NanInTrajectory(QAEnv):
    def rollout(self, skill, item, complete, prompts):
        out = super().rollout(skill, item, complete, prompts)
        import dataclasses
        return dataclasses.replace(out, trajectory={"turns": [{"score": float("nan")}]})


class NanTurnScore(RoomsEnv):
    def open(self, item, seed):
        session = super().open(item, seed)
        step = session.step
        session.step = lambda action: Turn(step(action).action, "You look around.", score=float("nan"))
        return session


class Slow(QAEnv):
    def rollout(self, skill, item, complete, prompts):
        import os
        import time
        time.sleep(float(os.environ.get("SLOW_ROLLOUT_S", "1.0")))
        return super().rollout(skill, item, complete, prompts)


class Unbuildable(QAEnv):
    def __init__(self, splits, config=None):
        raise RuntimeError("the world server is not running on port 7000")
'''


@pytest.fixture
def bad_envs(tmp_path, monkeypatch):
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / "bad_envs.py").write_text(BAD_ENVS)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_episode"))
    yield "python:bad_envs:"
    sys.modules.pop("bad_envs", None)
    sys.modules.pop("rooms_env", None)


@pytest.mark.parametrize("name, words", [
    ("NanSoft", "item 'val-001': soft is nan, not a finite number"),
    ("InfHard", "item 'val-001': hard is inf, not a finite number"),
    ("Above", "hard is 1.5, outside [0, 1]"),
    ("Below", "soft is -0.5, outside [0, 1]"),
    ("TextHard", "hard is '1' (str), not a number"),
    ("NoSoft", "soft is None (NoneType), not a number"),
    ("ListSoft", "soft is [0.5] (list), not a number"),
    ("NotAnOutcome", "the outcome is dict, not a RolloutOutcome"),
    ("NanInTrajectory", "trajectory.turns[0].score is nan, which JSON cannot hold"),
])
def test_1_a_bad_score_or_type_from_an_environment_stops_the_run_before_it_is_written(bad_envs, tmp_path, name,
                                                                                       words):
    path = tmp_path / "s.db"
    db = f"sqlite:///{path}"
    line = one_line(invoke("run", "--env", bad_envs + name, "--run-id", "r", *FAST, "--db", db), 1, words)
    assert f"env '{bad_envs}{name}' returned a bad rollout for item" in line and "skillstate resume r" in line
    assert event_types(path, "r") == ["RunStarted"]  # nothing of the bad rollout was appended
    for cmd in (["runs"], ["audit", "r"], ["show", "r"]):
        assert invoke(*cmd, "--db", db).exit_code == 0, cmd


def test_1_a_nan_turn_score_in_an_episode_is_refused(bad_envs, tmp_path):
    path = tmp_path / "e.db"
    db = f"sqlite:///{path}"
    line = one_line(invoke("run", "--env", bad_envs + "NanTurnScore", "--run-id", "e", "--epochs", "1",
                           "--batch-size", "4", "-q", "--db", db), 1, "turn 1: Turn.score is nan")
    assert f"env '{bad_envs}NanTurnScore' failed on item" in line
    assert event_types(path, "e") == ["RunStarted"]
    assert invoke("runs", "--db", db).exit_code == 0


def test_1_the_event_encoder_never_writes_a_number_it_cannot_read_back(store):
    from skillstate.log.event_codec import UnencodableEventError, encode, encode_json
    from skillstate.log.events import GateDecided
    from skillstate.storage.store import GENESIS

    bad = GateDecided(step=1, decision="accept", candidate_score=math.nan, current_score=0.5, best_score=0.5)
    with pytest.raises(UnencodableEventError, match=r"GateDecided: candidate_score is nan"):
        encode(bad)
    with pytest.raises(UnencodableEventError):
        store.append("nan-run", [bad], last_seq=0, last_hash=GENESIS, new_run={})
    assert store.get_run("nan-run") is None and store.read_events("nan-run") == []
    with pytest.raises(UnencodableEventError, match=r"GateDecided: candidate_score is nan"):
        encode_json(bad)
    fine = GateDecided(step=1, decision="accept", candidate_score=0.75, current_score=0.5, best_score=0.5)
    good = encode(fine)
    assert json.loads(json.dumps(good, allow_nan=False)) == good
    assert encode_json(fine) == canonical_json(good)  # the stored text: the writer that checks writes the same


def test_1_a_log_damaged_before_this_check_hides_no_other_run_on_the_dashboard(tmp_path, monkeypatch):
    """A log an older skillstate wrote with a NaN in it (the encoder of then, which let it through): the
    dashboard lists that run as damaged and every other run as usual."""
    from starlette.testclient import TestClient

    from skillstate.dashboard.app import create_app
    from skillstate.dashboard.store_view import open_read_only
    from skillstate.log.events import GateDecided
    from skillstate.storage.store import Store

    db = f"sqlite:///{tmp_path / 'd.db'}"
    for run_id in ("fine", "nan"):
        assert invoke("run", "--run-id", run_id, *FAST, "--db", db).exit_code == 0
    writer = Store(db)
    monkeypatch.setattr("skillstate.storage.store.encode_json",  # the old encoder
                        lambda event: canonical_json(event.model_dump(mode="json")))
    last = writer.read_events("nan")[-1]
    writer.append("nan", [GateDecided(step=1, decision="accept", candidate_score=math.nan, current_score=0.5,
                                      best_score=0.5)], last_seq=last.seq, last_hash=last.hash)
    writer.close()
    store = open_read_only(db)
    with TestClient(create_app(store), raise_server_exceptions=False) as client:
        index = client.get("/")
        assert index.status_code == 200 and 'data-run="fine"' in index.text and ">damaged<" in index.text
        rows = {r["run_id"]: r for r in client.get("/api/runs").json()}
        assert rows["fine"]["status"] == "completed" and rows["nan"]["status"] == "damaged"
        assert rows["nan"]["damage"].startswith("run nan")
        assert client.get("/runs/fine").status_code == 200
        assert "Damaged log" in client.get("/runs/nan").text
    store.close()
    listed = invoke("runs", "--db", db)  # `runs` too lists every run, the damaged one as damaged, and says so
    assert listed.exit_code == 1 and "Traceback" not in listed.output
    table = {line.split()[0]: line.split()[1] for line in listed.output.splitlines()[2:] if line.split()}
    assert table["fine"] == "completed" and table["nan"] == "damaged", listed.output
    assert listed.output.strip().splitlines()[-1].startswith("Error: run nan")
    as_json = {r["run_id"]: r for r in json.loads(invoke("runs", "--db", db, "--json").stdout)}
    assert as_json["nan"]["status"] == "damaged" and as_json["fine"]["best_score"] is not None


# 2. An environment that cannot be built -----------------------------------------------------------------------


def test_2_an_environment_whose_constructor_raises_is_one_line_and_no_run(bad_envs, tmp_path):
    path = tmp_path / "u.db"
    for cmd in (["run", *FAST], ["eval", "--skill", "README.md", *QA, "-q"]):
        one_line(invoke(*cmd, "--env", bad_envs + "Unbuildable", "--db", f"sqlite:///{path}"), 2,
                 "bad_envs.Unbuildable() failed: RuntimeError: the world server is not running on port 7000")
        assert run_ids(path) == []


# 3. Reading never changes a file, and someone else's file is named as theirs ----------------------------------

READ_COMMANDS = (["runs"], ["audit"], ["show"], ["db", "check"], ["dashboard", "--port", "0"])


def snapshot(path: Path) -> tuple:
    """Everything a reader could change: the bytes, the mtime, the journal mode, the files beside it."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    beside = sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))
    return path.read_bytes(), path.stat().st_mtime_ns, mode, beside


def rollback_journal_copy(src: Path, dst: Path) -> Path:
    """A consistent copy of a database (the backup API), in rollback-journal mode, all in its one file."""
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        a.backup(b)
        b.execute("PRAGMA journal_mode=DELETE")
    finally:
        a.close()
        b.close()
    return dst


def lookalike(path: Path, *, alembic: bool) -> Path:
    """Another program's file with a table named like one of skillstate's (and, with `alembic`, its own
    alembic_version table at a revision skillstate does not know)."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, started TEXT)")
        conn.execute("INSERT INTO runs VALUES (1, 'monday')")
        if alembic:
            conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            conn.execute("INSERT INTO alembic_version VALUES ('3f9c2a7b1d04')")
    conn.close()
    return path


@pytest.mark.parametrize("alembic", [False, True], ids=["runs-table", "runs-table-and-own-alembic"])
def test_3_someone_elses_file_with_a_lookalike_table_is_named_foreign_and_left_as_it_was(tmp_path, alembic):
    path = lookalike(tmp_path / "other.db", alembic=alembic)
    before = snapshot(path)
    for cmd in (*READ_COMMANDS, ["run", *FAST], ["db", "upgrade"]):
        line = one_line(invoke(*cmd, "--db", f"sqlite:///{path}"), 2, "is not a skillstate database")
        assert "runs only shares a name with skillstate's" in line and "restore" not in line, line
        assert snapshot(path) == before, cmd  # not switched to WAL, not written, no -wal/-shm file


def test_3_reading_a_skillstate_database_changes_nothing(tmp_path):
    from starlette.testclient import TestClient

    from skillstate.dashboard.app import create_app
    from skillstate.dashboard.store_view import open_read_only

    written = tmp_path / "written.db"
    assert invoke("run", "--run-id", "r", *FAST, "--db", f"sqlite:///{written}").exit_code == 0
    path = rollback_journal_copy(written, tmp_path / "ours.db")  # a skillstate file not in WAL mode
    db = f"sqlite:///{path}"
    before = snapshot(path)
    assert before[2] == "delete"
    for cmd in (["runs"], ["audit", "r"], ["show", "r"], ["db", "check"], ["log", "r"]):
        assert invoke(*cmd, "--db", db).exit_code == 0, cmd
        assert snapshot(path) == before, cmd
    store = open_read_only(db)
    with TestClient(create_app(store)) as client:
        assert client.get("/").status_code == 200
    store.close()
    assert snapshot(path) == before
    assert invoke("run", "--run-id", "r2", *FAST, "--db", db).exit_code == 0  # writing puts it in WAL mode
    assert snapshot(path)[2] == "wal"


# 4. Nothing is written into a corrupted file --------------------------------------------------------------------


def corrupt_a_middle_page(path: Path) -> str:
    """Damage one table page in the middle of `path` (a database all in its one file) the way a bad disk
    does, leaving the file readable: the count of fragmented bytes in the page's header. `PRAGMA
    quick_check` (and `db check`) finds it; nothing else is changed."""
    with sqlite3.connect(path) as conn:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    pages = len(data) // size
    page = next(p for p in range(pages // 2, pages) if data[p * size] == 13)  # a leaf page of a table
    data[page * size + 7] = (data[page * size + 7] + 37) % 256
    path.write_bytes(bytes(data))
    return f"on page {page + 1}"


def test_4_run_refuses_a_file_corrupted_in_the_middle_before_writing(tmp_path):
    written = tmp_path / "written.db"
    for n in range(3):
        assert invoke("run", "--run-id", f"r{n}", *FAST, "--db", f"sqlite:///{written}").exit_code == 0
    path = rollback_journal_copy(written, tmp_path / "c.db")
    db = f"sqlite:///{path}"
    where = corrupt_a_middle_page(path)
    one_line(invoke("db", "check", "--db", db), 2, where)  # what db check finds
    before = path.read_bytes()
    for cmd in (["run", "--run-id", "new", *FAST], ["resume", "r0"], ["fork", "r0", "0", "--run-id", "f"],
                ["eval", "--skill", "README.md", *QA, "-q", "--run-id", "e"]):
        line = one_line(invoke(*cmd, "--db", db), 2, f"the database file of {db} is damaged: Fragmentation")
        assert where in line and "nothing was written" in line
        assert path.read_bytes() == before, cmd
    assert run_ids(path) == ["r0", "r1", "r2"]


# 5. A PostgreSQL port that takes the connection and never answers ------------------------------------------------


@pytest.fixture
def silent_port():
    """A server on 127.0.0.1 that accepts every connection and never says a word."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("how", ["env", "url"])
def test_5_a_postgresql_port_that_never_answers_is_refused_after_the_connect_timeout(silent_port, how):
    """In a process of its own, so that a hang fails the test instead of holding it."""
    import os
    import subprocess

    pytest.importorskip("psycopg")
    url = f"postgresql+psycopg://someone@127.0.0.1:{silent_port}/team"
    env = {**os.environ, "SKILLSTATE_DB_CONNECT_TIMEOUT": "2"}
    if how == "url":
        url += "?connect_timeout=2"
        env.pop("SKILLSTATE_DB_CONNECT_TIMEOUT")
    # the commands at once: each waits out its own connect timeout
    procs = [subprocess.Popen([sys.executable, "-c", "from skillstate.cli.main import cli; cli()", *cmd, "--db", url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for cmd in ((["runs"], ["run", *FAST]) if how == "env" else (["runs"],))]
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and stdout == "", (stdout, stderr)
        assert "connection timeout expired (no answer within the connect timeout" in lines[0], lines[0]


def test_5_the_connect_timeout_setting_is_checked():
    one_line(invoke("runs", "--db", "postgresql+psycopg://someone@127.0.0.1:1/team",
                    env={"SKILLSTATE_DB_CONNECT_TIMEOUT": "soon"}), 2,
             "$SKILLSTATE_DB_CONNECT_TIMEOUT must be a whole number of seconds from 1 to 3600, got 'soon'")


# 6. The dashboard on a port in use ------------------------------------------------------------------------------


def test_6_the_dashboard_on_a_port_in_use_is_one_line(tmp_path):
    import socket

    path = tmp_path / "d.db"
    assert invoke("run", "--run-id", "r", *FAST, "--db", f"sqlite:///{path}").exit_code == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line(invoke("dashboard", "--port", port, "--db", f"sqlite:///{path}"), 2,
                 f"cannot listen on 127.0.0.1:{port}: Address already in use (another program is listening there: "
                 "pick another --port")
    one_line(invoke("dashboard", "--host", "[no such address]", "--db", f"sqlite:///{path}"), 2, "cannot listen on")


# 7. Ctrl-C during eval -------------------------------------------------------------------------------------------


def test_7_ctrl_c_during_eval_exits_130_and_names_the_saved_evaluation_run(bad_envs, tmp_path, monkeypatch):
    """A real SIGINT to a real process, once its evaluation run exists."""
    import os
    import signal
    import subprocess
    import time

    path = tmp_path / "ev.db"
    db = f"sqlite:///{path}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # 2 items at a time of 1 s each: 12 s for the 24 items, so the interrupt lands in the middle even when a
    # loaded machine takes a few seconds to see the run appear
    proc = subprocess.Popen([sys.executable, "-c", "from skillstate.cli.main import cli; cli()", "eval", "--env",
                             bad_envs + "Slow", "--skill", "README.md", *QA, "--set", "concurrency=2", "--run-id", "ev",
                             "-q", "--db", db],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            # as in a terminal: SIGINT not ignored (a parent that ignores it would pass that on,
                            # and Python then installs no KeyboardInterrupt handler)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while "ev" not in run_ids(path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 130 and out == "" and len(lines) == 1, (proc.returncode, out, err)
    assert lines[0] == ("Error: interrupted; the evaluation run ev is saved: finish it with: "
                        f"skillstate resume ev --db {db}")
    assert invoke("audit", "ev", "--db", db).exit_code == 0
    monkeypatch.setenv("SLOW_ROLLOUT_S", "0.01")  # the interrupt has landed: the rest need not take 1 s an item
    finished = invoke("resume", "ev", "-q", "--db", db)
    assert finished.exit_code == 0 and "eval run ev: evaluated" in finished.output, finished.output
