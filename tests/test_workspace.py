"""Workspace tasks (issue 24, §1 and §2): a coding agent changes a project in a fresh copy of its
directory, its commands and the task's check run under bubblewrap, and the sim plays skillstate's
built-in coding agent, whose competence depends on the skill."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from conftest import small_config
from run_helpers import call

from skillstate.envs.registry import apply_settings, env_settings, resolve_env
from skillstate.envs.workspace.env import SANDBOX_ROOT, WorkspaceEnv, stable
from skillstate.envs.workspace.sandbox import SandboxSettings, check_sandbox, run_command
from skillstate.envs.workspace.tasks import bundled_tasks
from skillstate.errors import ConfigError
from skillstate.llm.base import CallResult, ChatRequest
from skillstate.log.events import CallRef
from skillstate.reading.audit import audit, verify
from skillstate.sim.backend import sim_backend_for
from skillstate.sim.coder import RULES
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (.ci/run installs it)")
FAST = SandboxSettings(wall_seconds=4, max_processes=64)


def build(**env_config) -> WorkspaceEnv:
    cls = resolve_env("workspace")
    settings = env_settings(cls, env_config, "workspace")
    env = cls(cls.builtin_splits(settings, ["train", "val", "test"]), settings)
    apply_settings(env, small_config(env="workspace"))
    return env


def complete_with(env):
    backend = sim_backend_for(env)

    def complete(messages, tools=None) -> CallResult:
        request = ChatRequest.build("sim", "sim-target", messages, 0.0, 256, tools=tools)
        resp = backend.complete(request)
        return CallResult(CallRef(request_hash=request.hash, role="target"), text=resp.text, tool_calls=resp.tool_calls)

    return complete


# --- the sandbox -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("command", "seen"), [
    ("echo x > /etc/skillstate-escape", "Permission denied"),  # /etc holds a few entries, read-only
    ("echo x > $HOME/../../escape && echo wrote", "Permission denied"),  # the view's root is not the machine's
    ("python -c 'import socket; socket.create_connection((\"127.0.0.1\", 5432), timeout=2)'", "Connection refused"),
    ("python -c 'import urllib.request; urllib.request.urlopen(\"http://pypi.org\", timeout=2)'", "URLError"),
    ("python -c 'bytearray(8 << 30)'", "MemoryError"),
])
def test_a_command_cannot_escape_and_says_why(tmp_path, command, seen):
    import os

    result = run_command(command, tmp_path, FAST, SANDBOX_ROOT)
    if os.geteuid() != 0 and seen == "Permission denied" and result.ok:
        pass  # an ordinary user owns its sandbox's own root folder in memory: the write stayed there
    else:
        assert not result.ok and seen in result.output, result.output
    assert not (tmp_path.parent.parent / "escape").exists() and not os.path.exists("/etc/skillstate-escape")


def test_a_command_that_outruns_its_time_or_forks_without_end_is_stopped(tmp_path):
    # a 2 s limit: whatever the machine's load, both commands outrun it (one sleeps, the other forks for ever)
    limit = SandboxSettings(wall_seconds=2, max_processes=64)
    slow = run_command("sleep 30", tmp_path, limit, SANDBOX_ROOT)
    assert slow.timed_out and slow.summary() == "killed: it ran past the time limit"
    bomb = run_command("f(){ f|f& }; f; sleep 30", tmp_path, limit, SANDBOX_ROOT)
    # stopped either way: killed at its time limit, or its shell could not even fork `sleep` under the
    # process limit and gave up (on a busy machine the limit is reached before the bomb's shell gets that far)
    assert not bomb.ok and (bomb.timed_out or "Cannot fork" in bomb.output), bomb.output[-300:]


def test_the_workspace_is_writable_at_a_stable_path(tmp_path):
    result = run_command("pwd; echo hi > made.txt", tmp_path, FAST, SANDBOX_ROOT)
    assert result.ok and result.output.strip() == SANDBOX_ROOT and (tmp_path / "made.txt").read_text() == "hi\n"


def test_without_bubblewrap_the_run_is_refused_unless_the_user_opts_out(monkeypatch):
    monkeypatch.setattr("skillstate.envs.workspace.sandbox.bwrap_path", lambda: None)
    with pytest.raises(ConfigError, match=r"needs bubblewrap .*sandbox\.kind: none"):
        check_sandbox(SandboxSettings())
    check_sandbox(SandboxSettings(kind="none"))


def test_outputs_are_stable_between_identical_runs():
    assert stable("3 passed in 0.42s\nat 0x7f3a2b1c4d50") == "3 passed\nat 0x…"


# --- the tasks and the agent's tools ----------------------------------------------------------------

def test_every_bundled_task_is_solved_by_its_reference_and_failed_without_it():
    env = build()
    for item in bundled_tasks()[:4]:  # one of each kind (all: the slow test below)
        assert env.check_solution(item, item["solution"])["exit_code"] == 0, item["id"]
        assert env.check_solution(item, item.get("wrong") or {})["exit_code"] != 0, item["id"]


@pytest.mark.slow
def test_all_bundled_tasks_check_as_they_should():
    env = build()
    for item in bundled_tasks():
        assert env.check_solution(item, item["solution"])["exit_code"] == 0, item["id"]
        assert env.check_solution(item, item.get("wrong") or {})["exit_code"] != 0, item["id"]


def test_the_file_tools_stay_inside_the_workspace(tmp_path):
    env = build()
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "a.txt").write_text("inside\n")
    assert env._act(root, "read_file", json.dumps({"path": "a.txt"})) == ("inside\n", False)
    for bad in ("../outside.txt", "/etc/passwd", "a/../../x"):
        out, invalid = env._act(root, "read_file", json.dumps({"path": bad}))
        assert invalid and out.startswith("error:"), bad
    env._act(root, "run", json.dumps({"command": "ln -s /etc/passwd link"}))
    out, invalid = env._act(root, "read_file", json.dumps({"path": "link"}))
    assert invalid and "outside the project" in out
    out, invalid = env._act(root, "write_file", json.dumps({"path": "link", "content": "x"}))
    assert invalid and "outside the project" in out
    out, invalid = env._act(root, "run", json.dumps({"command": "exit 3"}))
    assert not invalid and out.startswith("exit code 3")


@pytest.mark.slow  # sandboxed rollouts of every bundled task kind: about 15 s
def test_a_rollout_records_the_diff_and_the_check_and_a_skill_with_the_rules_does_better():
    env = build()
    items = env.items("val")
    complete = complete_with(env)
    plain = [env.rollout(env.default_skill(), item, complete, {}) for item in items]
    good = env.default_skill() + "\n" + "\n".join(f"- {r.variants[0]}" for r in RULES.values()) + "\n"
    taught = [env.rollout(good, item, complete, {}) for item in items]
    assert sum(r.hard for r in taught) > sum(r.hard for r in plain)
    solved = next(r for r in taught if r.hard == 1.0)
    assert solved.trajectory["diff"].startswith("--- a/") and solved.trajectory["check"]["exit_code"] == 0
    assert [s["tool"] for s in solved.trajectory["steps"]][0] == "list_files"
    failed = next(r for r in plain if r.hard == 0.0)
    assert failed.fail_reason.startswith("check_failed: exit code")
    view = env.reflection_view(failed.trajectory)
    assert "check" in view and "diff" in view and json.dumps(view)


# --- runs ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workspace_run(tmp_path_factory):
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('ws') / 'runs.db'}")
    # one epoch (two steps) learns: a second only doubled the sandboxed rollouts that verify checks again
    Trainer(small_config(env="workspace", num_epochs=1, batch_size=6), store=store, run_id="w").train()
    return store


def test_a_workspace_run_learns_the_projects_ways_and_verifies(workspace_run):
    summary = json.loads(call("show", "w", "--json", "--db", workspace_run.url))
    assert summary["best_score"] > summary["baseline_score"]
    assert audit(workspace_run, "w").ok
    report = verify(workspace_run, "w")
    assert report.ok and report.checked == report.total


def test_the_run_refuses_a_bad_workspace_config_in_one_line(tmp_path):
    from test_inputs_config import refused

    refused(tmp_path / "x.db", "run", "--set", "env=workspace", "--set", "env_config.sandbox.kind=docker",
            match="env_config.sandbox.kind")


def test_the_checks_use_the_drivers_python():
    env = build()
    item = bundled_tasks()[1]
    result = env.check_solution(item, item["solution"])
    assert result["exit_code"] == 0 and sys.executable not in result["output"]


# --- what an agent can leave behind -----------------------------------------------------------------

def test_check_files_are_never_written_through_a_symlink_the_agent_planted(tmp_path):
    env = build()
    item = bundled_tasks()[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "workspace"
    root.mkdir()
    env._act(root, "write_file", json.dumps({"path": "README.md", "content": "x"}))
    (root / "tests").symlink_to(outside)
    result = env._check(root, item)
    assert list(outside.iterdir()) == [] and result["exit_code"] != 0
    assert (root / "tests").is_dir() and not (root / "tests").is_symlink()


def test_what_the_agent_leaves_in_the_workspace_never_stops_the_run(tmp_path):
    import os

    env = build()
    root = tmp_path / "workspace"
    root.mkdir()
    os.mkfifo(root / "pipe")  # a FIFO is listed, never read (reading it would hang)
    env._act(root, "run", json.dumps({"command": "touch $(printf 'bad\\377name')"}))
    listing, _ = env._act(root, "list_files", "{}")
    assert "pipe" not in listing and "bad\ufffdname" in listing
    json.dumps(listing, ensure_ascii=False).encode("utf-8")  # it goes into a request
    env._act(root, "write_file", json.dumps({"path": "a.py", "content": "x"}))
    for name, args in (("write_file", {"path": "a.py/b.py", "content": "x"}),
                       ("write_file", {"path": "x.py", "content": "\ud83d"}),
                       ("run", {"command": "a\u0000b"}), ("read_file", {"path": "pipe"})):
        out, invalid = env._act(root, name, json.dumps(args))
        assert invalid and out.startswith(("error:", "it could not start")), (name, out)
    out, invalid = env._act(root, "run", json.dumps({"command": "exit 1"}))  # failing tests are no misuse
    assert out.startswith("exit code 1") and not invalid


def test_a_conftest_or_a_config_file_the_agent_adds_cannot_pass_the_check():
    env = build()
    item = bundled_tasks()[0]
    hack = {"conftest.py": "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
                           "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                           "    outcome.get_result().outcome = 'passed'\n",
            "pytest.py": "import sys\nsys.exit(0)\n", "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-x'\n"}
    assert env.check_solution(item, hack)["exit_code"] != 0


def test_the_sandbox_hides_the_drivers_files_and_bounds_output(tmp_path):
    from pathlib import Path

    import skillstate
    from skillstate.envs.workspace.sandbox import MAX_OUTPUT

    package = Path(skillstate.__file__).parent
    seen = run_command(f"cat {package / 'envs' / 'workspace' / 'tasks.py'} | head -3; ls {Path.cwd()} | head -3",
                       tmp_path, FAST, SANDBOX_ROOT)
    assert "bundled" not in seen.output and "pyproject.toml" not in seen.output
    loud = run_command("yes | head -c 30000000; head -c 100000000 /dev/zero > big; ls -l big", tmp_path, FAST,
                       SANDBOX_ROOT)
    assert len(loud.output) < MAX_OUTPUT + 200 and "File size limit exceeded" in loud.output


def test_a_long_check_keeps_its_last_line_for_the_soft_score():
    from skillstate.envs.workspace.checking import soft_of_output as _soft
    from skillstate.envs.workspace.sandbox import head_and_tail

    assert _soft(head_and_tail("x" * 5000 + '\n{"score": 0.5}', 4000), 0.0) == 0.5


def test_a_workspace_item_with_a_file_where_a_directory_goes_is_refused():
    from pydantic import ValidationError

    from skillstate.envs.workspace.env import WorkspaceItem

    with pytest.raises(ValidationError, match="both a file and the directory"):
        WorkspaceItem(id="x", instruction="i", check="true", files={"a": "1", "a/b": "2"})
    with pytest.raises(ValidationError, match="both a file and the directory"):
        WorkspaceItem(id="x", instruction="i", check="true", files={"a": "1"}, check_files={"a/t.py": "2"})


@pytest.mark.slow  # a whole run of the example: about 13 s
def test_the_workspace_example_config_runs_from_its_own_folder(tmp_path):
    from conftest import EXAMPLES

    out = call("run", "--config", str(EXAMPLES / "skills" / "workspace.yaml"), "--set", "num_epochs=1",
               "--db", f"sqlite:///{tmp_path / 'e.db'}")
    assert "skill triggers" in out and "every file is" in out


def test_a_failed_target_call_is_never_a_success_even_when_the_check_passes():
    env = build()
    item = next(i for i in env.items("val") if i["task_type"] == "export")
    sim = complete_with(env)
    good = env.default_skill() + "\n" + "\n".join(f"- {r.variants[0]}" for r in RULES.values()) + "\n"
    turns = []

    def complete(messages, tools=None) -> CallResult:
        turns.append(1)
        if any(m["role"] == "tool" and m["content"].startswith("wrote ") for m in messages):  # after the writes
            return CallResult(CallRef(request_hash="x" * 64, role="target"), error="HTTP 500: server error")
        return sim(messages, tools)

    outcome = env.rollout(good, item, complete, {})
    assert outcome.trajectory["check"]["exit_code"] == 0  # the change was right
    assert outcome.hard == 0.0 and outcome.fail_reason.startswith("rollout_error")
