"""External agents as the target of workspace tasks (issue 24, §3): an agent program runs in the sandbox,
its model calls go through the journaling proxy into the run's journal, and the task's check scores what
it left. The `command` harness runs examples/agents/shell_agent.py (the `openai` client over the proxy);
the sim plays its model through the program's own `bash` tool. Codex, a real CLI, is in the slow suite."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import small_config

from skillstate.envs.workspace.harness import HarnessSettings, read_events
from skillstate.envs.workspace.tasks import bundled_splits
from skillstate.errors import ConfigError
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (.ci/run installs it)")
ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "examples" / "agents" / "shell_agent.py"
SKILL = ROOT / "examples" / "skills" / "tally-conventions"
DISTRACTOR = ROOT / "examples" / "skills" / "distractors" / "number-words"
SECRET = "sk-test-do-not-leak-0123456789abcdef"


def tiny_data(folder: Path, per_split: int = 2) -> Path:
    """The first bundled tasks of each split (one of each kind first), as a data directory."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, items in bundled_splits(["train", "val", "test"]).items():
        chosen = sorted(items, key=lambda i: (i["task_type"], i["id"]))[::max(1, len(items) // per_split)][:per_split]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in chosen))
    return folder


def harness_config(data: Path, command: list[str], wall_seconds: float = 120, **kw):
    settings = dict(env="workspace", data=str(data), initial_skill=str(SKILL), disclosure="tools",
                    distractor_skills=[str(DISTRACTOR)], batch_size=2, num_epochs=1, concurrency=2,
                    env_config={"harness": {"kind": "command", "command": command, "wall_seconds": wall_seconds,
                                            "show": [str(AGENT.parent)]}})
    return small_config(**{**settings, **kw})


def trajectories(store: Store, run_id: str) -> list[dict]:
    from skillstate.engine.loading import load_run

    loaded = load_run(store, run_id)
    out = []
    for stored in loaded.own:
        for result in getattr(stored.event, "results", None) or []:
            if getattr(result, "trajectory", None):
                out.append(json.loads(store.get_blob(result.trajectory)))
    return out


NET_PROBE = ("import socket,sys\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
             "    print('REACHED')\nexcept OSError as e:\n    print('BLOCKED', e)\n")


@pytest.fixture(scope="module")
def command_run(tmp_path_factory):
    """One run of the command agent, which every test of that run reads. Before the agent starts, its command
    prints its whole environment (so a key that reached it would be in its events) and tries to reach a server
    on the driver's loopback (`test_the_agent_reaches_its_model_and_nothing_else`)."""
    import http.server
    import threading

    folder = tmp_path_factory.mktemp("harness")
    old = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = SECRET  # the driver's key: it must reach neither the agent nor the log
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    probe = NET_PROBE.format(port=server.server_address[1])
    try:
        store = Store(f"sqlite:///{folder / 'runs.db'}")
        command = ["bash", "-c", f"env | sort | sed 's/^/# /'; {sys.executable} -c \"$1\"; "
                                 f"exec {sys.executable} {AGENT} \"$0\"", "{task}", probe]
        Trainer(harness_config(tiny_data(folder / "data"), command), store=store, run_id="h").train()
    finally:
        server.shutdown()
        if old is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = old
    return store, folder / "runs.db"


def test_a_command_agent_completes_a_run_through_the_proxy_and_passes_audit(command_run):
    store, _path = command_run
    assert audit(store, "h").ok
    trajs = trajectories(store, "h")
    assert trajs and all(t["harness"] == "command" for t in trajs)
    for t in trajs:
        assert t["exchanges"] and all(x["api"] == "chat" for x in t["exchanges"])
        assert any(e.get("type") == "answer" for e in t["events"] if isinstance(e, dict)), t["log"]
        assert ".agents/skills" not in t["diff"]  # the installed skills are gone before the diff and the check
        assert not any(p.startswith(".agents/") for p in t["changed_files"])
        assert t["skills_installed"] == ["number-words", "tally-conventions"]
    # the model saw the catalogue the program built from the installed skills, and read a SKILL.md through it
    assert any("cat" in s["arguments"] and "SKILL.md" in s["arguments"] for t in trajs for s in t["steps"])


def test_each_model_call_of_the_agent_is_one_journaled_target_call(command_run):
    store, path = command_run
    trajs = trajectories(store, "h")
    with sqlite3.connect(path) as db:
        journaled = db.execute("select count(*) from llm_calls where role = 'target'").fetchone()[0]
    made = sum(len(t["exchanges"]) for t in trajs)
    assert made and journaled >= made  # rollouts done ahead that the gate made obsolete are journaled too


def test_the_drivers_key_reaches_neither_the_agent_nor_the_log(command_run):
    _store, path = command_run
    assert SECRET.encode() not in path.read_bytes()
    wal = Path(str(path) + "-wal")
    assert not wal.exists() or SECRET.encode() not in wal.read_bytes()
    trajs = trajectories(_store, "h")
    env_lines = [line for t in trajs for line in t["log"] if line.startswith("# ")]
    assert any(line.startswith("# OPENAI_API_KEY=skillstate-proxy-") for line in env_lines)
    assert any(line.startswith("# HOME=/tmp/home") for line in env_lines)  # its own state is not in the workspace
    assert any(line.startswith("# OPENAI_BASE_URL=http://127.0.0.1:") for line in env_lines)


def test_verify_checks_the_recorded_rollouts_and_never_reruns_the_agent(command_run, monkeypatch):
    """An external agent's rollouts are taken from the log and checked (the check run again on the recorded
    final workspace); the rest of the run is re-executed from the journal. The agent never runs."""
    from skillstate.envs.workspace import external

    def no_agent(*args, **kwargs):
        raise AssertionError("verification ran the agent")

    monkeypatch.setattr(external, "external_rollout", no_agent)
    store, _path = command_run
    report = verify(store, "h")
    assert report.ok and report.checked == report.total


def test_a_recorded_workspace_the_check_disagrees_with_is_found(command_run, tmp_path):
    import copy
    from types import SimpleNamespace

    from skillstate.envs.registry import env_settings, resolve_env
    from skillstate.envs.workspace.files import diff_of as _diff
    from skillstate.envs.workspace.workspace_record import record_workspace

    store, _path = command_run
    cls = resolve_env("workspace")
    env = cls({"train": [], "val": [], "test": []},
              env_settings(cls, {"harness": {"kind": "command", "command": [sys.executable, str(AGENT)]}}, "workspace"))
    items = {i["id"]: i for split in bundled_splits(["train", "val", "test"]).values() for i in split}
    trajectory = trajectories(store, "h")[0]
    item = items[trajectory["item_id"]]
    recorded = SimpleNamespace(calls=[None] * len(trajectory["exchanges"]), fail_reason=trajectory["fail_reason"],
                               hard=1.0 if trajectory["success"] else 0.0)
    assert env.check_recorded(item, trajectory, recorded, store.get_blob) is None
    # the other outcome's workspace, with its own diff: the check disagrees
    other = {**item["files"], **({} if trajectory["success"] else item["solution"])}
    if trajectory["success"]:
        other.update({p: t for p, t in item.get("wrong", {}).items()} or {"tally/money.py": "broken("})
    root = tmp_path / "other"
    root.mkdir()
    for path, text in other.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    record = record_workspace(root, item["files"], 1 << 20)
    blobs = {**record.blobs}
    changed = copy.deepcopy(trajectory)
    changed["workspace"] = record.hash
    changed["diff"] = _diff(item["files"], other, env.max_diff_chars)
    def blob(h):
        return blobs.get(h) or store.get_blob(h)

    assert "the check now gives" in env.check_recorded(item, changed, recorded, blob)
    changed["diff"] = "--- something else"
    assert "diff" in env.check_recorded(item, changed, recorded, blob)
    assert "model calls" in env.check_recorded(item, trajectory, SimpleNamespace(**{**vars(recorded), "calls": []}),
                                               store.get_blob)


def test_the_agent_reaches_its_model_and_nothing_else(command_run):
    """Under bubblewrap the agent's network is the proxy alone: a server on the driver's loopback is out of reach
    (`command_run`'s agent tried it before it started)."""
    store, _path = command_run
    trajs = trajectories(store, "h")
    said = [line for t in trajs for line in t["log"]]
    assert trajs and any(line.startswith("BLOCKED") for line in said) and not any("REACHED" in s for s in said)
    assert all(t["exchanges"] for t in trajs)  # while the proxy answered


def test_an_agent_that_fails_or_hangs_is_a_failed_rollout_not_a_crash(tmp_path):
    data = tiny_data(tmp_path / "data", 1)
    # the failing agent has 2 s to start and fail (a loaded machine); the hanging one is stopped after 1 s
    for name, command, reason, wall in (
            ("exit", ["bash", "-c", "echo broken >&2; exit 3"], "harness_failed", 2),
            ("hang", ["bash", "-c", "sleep 600"], "harness_timeout", 1)):
        store = Store(f"sqlite:///{tmp_path / (name + '.db')}")
        # no test-split evaluation: its rollouts are not among the trajectories checked here (the run's events
        # hold the rollout stages'), and each one of the hanging agent's waits out its time limit
        config = harness_config(data, command, wall_seconds=wall, batch_size=1, eval_test=False)
        Trainer(config, store=store, run_id=name).train()
        trajs = trajectories(store, name)
        assert trajs and all(t["fail_reason"].startswith(reason) and not t["success"] for t in trajs)
        assert audit(store, name).ok


@pytest.mark.slow  # a driver process killed and resumed, each rollout an agent in the sandbox: about 12 s (20 s and
# more beside the other tests); the harness's runs are in the default suite above, kill -9 and resume in test_sweep
def test_a_crash_in_a_harness_rollout_resumes_to_a_completed_run_with_each_paid_call_counted_once(tmp_path):
    """kill -9 while an agent waits for its third model call: the calls journaled before the crash stay counted,
    the resumed run re-runs the unfinished rollouts (served from the journal where a request is the same), and
    completes; it passes audit and verification, and no request was sent twice."""
    import yaml
    from run_helpers import call, kill_at_pause, start_driver

    config = harness_config(tiny_data(tmp_path / "data", 1), [sys.executable, str(AGENT), "{task}"], batch_size=1)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    proc = start_driver(tmp_path, "crash", ["run", "--config", str(path), "--db", db], SWEEP_PAUSE_CALLS="3")
    assert kill_at_pause(tmp_path, "crash", proc) == "calls 3"
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        (run_id,) = conn.execute("select run_id from runs").fetchone()
        paid_at_crash = conn.execute("select count(*) from llm_calls").fetchone()[0]
        assert conn.execute("select count(*) from events where type = 'BaselineEvaluated'").fetchone()[0] == 0
    assert paid_at_crash >= 3
    call("resume", run_id, "--db", db)
    store = Store(db)
    assert audit(store, run_id).ok and verify(store, run_id).ok
    summary = json.loads(call("show", run_id, "--json", "--db", db))
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        rows, distinct = conn.execute("select count(*), count(distinct request_hash) from llm_calls").fetchone()
    assert rows == distinct and rows >= paid_at_crash  # nothing sent twice; what was paid before the crash kept
    assert summary["status"] == "completed"


def workspace_env(command: list[str], **harness):
    from skillstate.envs.registry import env_settings, resolve_env

    cls = resolve_env("workspace")
    splits = bundled_splits(["train", "val", "test"])
    return cls(splits, env_settings(cls, {"harness": {"kind": "command", "command": command, **harness}},
                                    "workspace"))


POSTS_THEN_SLEEPS = """import json, os, time, urllib.request
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
try:
    urllib.request.urlopen(request, timeout=30)
except Exception as err:
    print("refused", err)
time.sleep(60)
"""


def test_when_the_run_stops_taking_calls_the_agent_is_stopped_at_once():
    """A call that raises (the run's budget ran out) stops the agent at once, not at its time limit, and the
    error reaches the rollout."""
    import time

    env = workspace_env([sys.executable, "-c", POSTS_THEN_SLEEPS], wall_seconds=300)
    item = bundled_splits(["train"])["train"][0]

    def complete(messages, tools=None):
        raise RuntimeError("the run's budget ran out")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="budget"):
        env.rollout(env.default_skill(), item, complete, {})
    assert time.monotonic() - start < 30


def test_an_agent_that_does_the_work_but_crashes_has_not_succeeded():
    """A check that passes does not make a crashed or timed-out agent's rollout a success."""
    env = workspace_env([sys.executable, "-c", "pass"])
    item = bundled_splits(["train"])["train"][0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "workspace"
        root.mkdir()
        for path, text in {**item["files"], **item["solution"]}.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        assert env.judge(root, item, "")[0] == 1.0
        for reason in ("harness_failed: exit code 3", "harness_timeout: the agent ran past 2 s"):
            hard, _soft, kept, _diff, _check = env.judge(root, item, reason)
            assert hard == 0.0 and kept == reason


def test_removing_the_installed_skills_follows_no_symlink_the_agent_planted(tmp_path):
    from skillstate.envs.workspace.external import _remove_installed

    outside = tmp_path / "outside" / "skills" / "tally-conventions"
    outside.mkdir(parents=True)
    (outside / "precious.txt").write_text("keep me")
    root = tmp_path / "workspace"
    root.mkdir()
    (root / ".agents").symlink_to(tmp_path / "outside")  # the agent replaced .agents with a link out
    _remove_installed(root, ".agents/skills", ["tally-conventions"], {"files": {}})
    assert (outside / "precious.txt").read_text() == "keep me"
    (root / ".agents").unlink()
    own = {".agents/skills/tally-conventions/SKILL.md": "the project's own"}
    (root / ".agents" / "skills" / "tally-conventions").mkdir(parents=True)
    (root / ".agents" / "skills" / "tally-conventions" / "SKILL.md").write_text("installed")
    _remove_installed(root, ".agents/skills", ["tally-conventions"], {"files": own})
    assert (root / ".agents/skills/tally-conventions/SKILL.md").read_text() == "the project's own"


def test_the_sandbox_hides_the_machines_unix_sockets(tmp_path):
    """A read-only file system does not stop a connect: the folders of the machine's listening sockets (a
    database's) are hidden from the sandbox."""
    from skillstate.envs.workspace.sandbox import SandboxSettings, run_command

    with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
        sockets = sorted({parts[7] for parts in (line.split() for line in f.read().splitlines()[1:])
                          if len(parts) > 7 and parts[7].startswith("/") and not parts[7].startswith("/tmp/")})
    if not sockets:
        pytest.skip("no listening Unix socket on this machine")
    probe = ("import socket, sys\nfor path in sys.argv[1:]:\n    s = socket.socket(socket.AF_UNIX)\n    try:\n"
             "        s.connect(path); print('CONNECTED', path)\n    except OSError as e:\n        print('NO', e)\n")
    result = run_command(f"python -c {shlex.quote(probe)} " + " ".join(shlex.quote(p) for p in sockets[:5]),
                         tmp_path, SandboxSettings(wall_seconds=20), "/tmp/workspace")
    assert "NO" in result.output and "CONNECTED" not in result.output, result.output


def test_presets_and_settings_refuse_what_cannot_run_in_one_line(monkeypatch):
    with pytest.raises(ValueError, match="Generative Language API"):
        HarnessSettings(kind="gemini")
    with pytest.raises(ValueError, match="executable alone"):
        HarnessSettings(kind="codex", command=["codex", "--flag"])
    with pytest.raises(ConfigError, match="command"):
        HarnessSettings(kind="command").executable()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="npm install -g @openai/codex"):
        HarnessSettings(kind="codex").executable()


def test_an_agents_output_is_read_as_events():
    events, other = read_events('warming up\n{"type": "a"}\n[{"type": "b"}, {"type": "c"}]\n\n')
    assert events == [{"type": "a"}, {"type": "b"}, {"type": "c"}] and other == ["warming up"]


def test_verify_takes_an_external_agents_rollouts_from_every_event_that_holds_them():
    """The minibatch screen (on by default) and the repair and the search roll the agent out too, in the parts
    their events list: verification must find those rollouts as well as a stage's own."""
    from skillstate.engine.recorded import _rolled_out
    from skillstate.log.events import Edit, ItemResult, RolloutCompleted
    from skillstate.log.events_screen import EditsScreened, EditTried

    result = ItemResult(item_id="export-01", hard=1.0, soft=1.0)
    tried = EditTried(index=0, edit=Edit(op="append", content="- Run the tests."), aimed_types=["export"],
                      skill="s1", item_ids=["export-01"], results=[result], failed=1, gain=1.0, passed=True)
    screened = EditsScreened(step=1, tried=[tried, tried.model_copy(update={"skill": "s2"})])
    assert [s for s, _ in _rolled_out(screened)] == ["s1", "s2"]
    assert _rolled_out(EditsScreened(step=1)) == []
    rollout = RolloutCompleted(step=1, skill="s0", results=[result])
    assert _rolled_out(rollout) == [("s0", [result])]
