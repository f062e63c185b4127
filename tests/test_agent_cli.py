"""Real agent CLIs as the target (issue 24, §3): Codex, Qwen Code and Claude Code, installed from npm by .ci/run
at pinned versions, run each rollout in the sandbox against `skillstate sim-server` through the run's journaling
proxy. Codex speaks the OpenAI Responses API, Qwen Code chat completions, Claude Code Anthropic Messages, all
streaming; the sim plays their model through each CLI's own shell tool. The run completes, passes audit and
verifies, as any run does."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_harness import DISTRACTOR, SKILL, tiny_data, trajectories

from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store

pytestmark = [pytest.mark.agentcli,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (.ci/run installs it)")]


def needs(cli: str) -> None:
    if shutil.which(cli) is None:
        if os.environ.get("SKILLSTATE_REQUIRE_AGENT_CLIS"):
            pytest.fail(f"{cli} is not installed (.ci/run installs it from npm)")
        pytest.skip(f"{cli} is not installed (npm install -g; .ci/run does)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SKILLSTATE = shutil.which("skillstate") or "skillstate"


def skillstate(*args: str, env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([SKILLSTATE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("cli", "api", "stream", "shell"), [
    ("codex", "responses", True, "cmd"),  # Codex 0.171: the Responses API, streamed; its exec_command tool
    ("qwen", "chat", True, "command"),  # Qwen Code 0.24: chat completions, streamed; its run_shell_command tool
    ("claude", "messages", True, "command"),  # Claude Code 2.1: Anthropic Messages, streamed; its Bash tool
])
def test_an_agent_cli_trains_through_the_proxy_against_the_sim_server_and_passes_audit(tmp_path, cli, api, stream,
                                                                                       shell):
    needs(cli)
    port = free_port()
    config = {
        "env": "workspace", "data": str(tiny_data(tmp_path / "data")), "backend": "openai",
        "target": {"model": "sim", "base_url": f"http://127.0.0.1:{port}/v1", "check_tools": False},
        "optimizer": {"model": "sim", "base_url": f"http://127.0.0.1:{port}/v1"},
        "initial_skill": str(SKILL), "disclosure": "tools", "distractor_skills": [str(DISTRACTOR)],
        "batch_size": 2, "num_epochs": 1, "concurrency": 2, "seed": 42,
        "env_config": {"harness": {"kind": cli, "wall_seconds": 180}},
    }
    path = tmp_path / f"{cli}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "OPENAI_API_KEY": "local"}
    server = subprocess.Popen([SKILLSTATE, "sim-server", "--port", str(port),
                               "--config", str(path)], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                said = server.stderr.read() if server.poll() is not None and server.stderr else ""
                assert not said and time.monotonic() < deadline, said
                time.sleep(0.2)
        db = f"sqlite:///{tmp_path / 'runs.db'}"
        done = skillstate("run", "--config", str(path), "--db", db, env=env, cwd=tmp_path, timeout=1500)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        run_id = done.stdout.split("started run ", 1)[1].split()[0]
    finally:
        server.terminate()
        server.wait(timeout=30)
    store = Store(db)
    assert audit(store, run_id).ok
    report = verify(store, run_id)  # the rollouts checked from the log (Codex's requests cannot be re-served)
    assert report.ok and report.checked == report.total, report.divergence
    trajs = trajectories(store, run_id)
    assert trajs and all(t["harness"] == cli for t in trajs)
    for t in trajs:
        assert t["exchanges"] and all(x["api"] == api and x["stream"] == stream for x in t["exchanges"])
        assert t["events"] and not t["fail_reason"].startswith(("harness_", "rollout_error")), t["log"][-5:]
    # the CLI ran the sim's commands with its own shell tool, and the sim read the installed skills through them
    commands = [json.loads(s["arguments"]).get(shell, "") for t in trajs for s in t["steps"]]
    assert any("SKILL.md" in c for c in commands)
    assert any(t["success"] for t in trajs)
    runs = json.loads(skillstate("runs", "--json", "--db", db, env=env, cwd=tmp_path, timeout=120).stdout)
    assert [r["status"] for r in runs if r["run_id"] == run_id] == ["completed"]
