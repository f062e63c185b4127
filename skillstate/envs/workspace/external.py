"""One rollout of a workspace task by an external agent (`env_config.harness`; see harness.py).

The rollout installs the skills, starts the journaling proxy, runs the agent in the sandbox (under
bubblewrap, behind the bridge; without a sandbox, pointed at the proxy's local port), removes the
installed skills and scores the workspace with the task's check. The trajectory holds the agent's
event stream, each model call it made through the proxy, the conversation as the model last saw it
(its tool calls, with their outputs, are the analysts' steps), the diff, the changed files (what
`replay --verify` checks again) and the check's result.

What holds on a crash: a rollout becomes an event only when it has finished, so a crash re-runs the
rollouts that had not; the calls they made were journaled when they were paid, so they stay counted;
an agent's requests differ from run to run (ids, dates), so a re-run is served from the journal only
where a request is the same.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from skillstate.envs.base import Complete, RolloutOutcome
from skillstate.envs.episode_loop import clip
from skillstate.envs.workspace.harness import (
    PROXY_PORT,
    PROXY_SOCKET,
    bridge_source,
    install_skills,
    launch,
    read_events,
    shown_paths,
)
from skillstate.envs.workspace.proxy.server import AgentProxy
from skillstate.envs.workspace.sandbox import run_sandboxed
from skillstate.skilltree.bundle import is_bundle, unbundle
from skillstate.skilltree.frontmatter import front_matter_or_none

AGENT_OUTPUT = 400_000  # characters of an agent's output read (its event stream)
DEFAULT_NAME = "project-skill"


def installed_skills(env: Any, skill: str) -> list[tuple[str, dict[str, str | None]]]:
    """(name, files) of each skill the rollout installs: with disclosure, the trained one and the distractors;
    else the trained skill alone (a SKILL.md without front matter gets one, as an agent needs it to list it)."""
    if env.installation is not None:
        return [(s.name or DEFAULT_NAME, dict(s.files)) for s in env.installation.skills(skill)]
    if is_bundle(skill):
        from skillstate.envs.disclosure import installed_skill

        one = installed_skill(unbundle(skill))
        return [(one.name or DEFAULT_NAME, dict(one.files))]
    front = front_matter_or_none(skill)
    if front is not None and front.fields.get("name"):
        return [(str(front.fields["name"]), {"SKILL.md": skill})]
    head = (f"---\nname: {DEFAULT_NAME}\n"
            "description: How to work on this project: its conventions and its tests.\n---\n\n")
    return [(DEFAULT_NAME, {"SKILL.md": head + skill})]


def _steps(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tool call of the conversation with its output, in order."""
    outputs = {m.get("tool_call_id"): str(m.get("content") or "") for m in conversation if m.get("role") == "tool"}
    steps, turn = [], 0
    for m in conversation:
        if m.get("role") != "assistant":
            continue
        turn += 1
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            steps.append({"turn": turn, "tool": fn.get("name", ""), "arguments": fn.get("arguments", ""),
                          "output": outputs.get(call.get("id"), ""), "invalid": False})
    return steps


def _remove_installed(base: Path, names: list[str], root: Path) -> None:
    for name in names:
        shutil.rmtree(base / name, ignore_errors=True)
    here = base
    while here != root and here.is_dir() and not any(here.iterdir()):
        here.rmdir()
        here = here.parent


def external_rollout(env: Any, tmp: Path, root: Path, skill: str, item: dict[str, Any],
                     complete: Complete) -> RolloutOutcome:
    from skillstate.envs.workspace.env import SANDBOX_ROOT, _snapshot

    h = env.harness
    skills = installed_skills(env, skill)
    where = h.installs_at()
    base = install_skills(root, where, skills)
    task = env.task_message(item)
    settings = env.sandbox.model_copy(update={"memory_mb": h.memory_mb})
    sandboxed = settings.kind == "bwrap"
    socket_path = tmp / "proxy.sock"
    with AgentProxy(complete, socket_path if sandboxed else None) as proxy:
        if sandboxed:
            how = launch(h, task, f"http://127.0.0.1:{PROXY_PORT}/v1", "/tmp", where)
            dirs = ":".join(sorted({v for v in how.env.values() if v.startswith("/tmp/")} - {PROXY_SOCKET}))
            argv = [sys.executable, "-c", bridge_source(), PROXY_SOCKET, str(PROXY_PORT), dirs, "--", *how.argv]
            result = proxy.run_while(lambda: run_sandboxed(
                argv, root, settings, SANDBOX_ROOT, env=how.env, stdin=how.stdin,
                binds={str(socket_path): PROXY_SOCKET}, shown=shown_paths(h), wall_seconds=h.wall_seconds,
                max_output=AGENT_OUTPUT))
        else:
            private = tmp / "private"
            how = launch(h, task, proxy.base_url, str(private), where)
            for value in how.env.values():
                if value.startswith(str(private) + "/"):
                    Path(value).mkdir(parents=True, exist_ok=True)
            result = proxy.run_while(lambda: run_sandboxed(
                how.argv, root, settings, None, env=how.env, stdin=how.stdin, wall_seconds=h.wall_seconds,
                max_output=AGENT_OUTPUT))
    if proxy.raised is not None:  # the run stopped taking calls (its budget, a fatal endpoint): not this rollout's
        raise proxy.raised
    _remove_installed(base, [name for name, _files in skills], root)
    events, said = read_events(result.output)
    answer = next((m.get("content") for m in reversed(proxy.conversation) if m.get("role") == "assistant"
                   and m.get("content")), None)
    if proxy.failure is not None:
        reason = f"rollout_error: {proxy.failure}"
    elif result.timed_out:
        reason = f"harness_timeout: the agent ran past {h.wall_seconds:g} s"
    elif result.exit_code != 0:
        last = said[-1] if said else ""
        reason = f"harness_failed: {result.summary()}: {clip(last, 200)}"
    elif not proxy.calls:
        reason = "harness_failed: the agent made no model call"
    else:
        reason = ""
    final = _snapshot(root)  # before the check writes its own files
    changed = {p: t for p, t in final.items() if item["files"].get(p) != t}
    removed = sorted(p for p in item["files"] if p not in final)
    hard, soft, reason, diff, check = env.judge(root, item, reason)
    trajectory = {"kind": "workspace", "harness": h.kind, "item_id": item["id"], "task": item["instruction"],
                  "answer": answer, "success": hard >= 1.0, "fail_reason": reason, "steps": _steps(proxy.conversation),
                  "messages": proxy.conversation, "events": events, "stderr": said, "exchanges": proxy.exchanges,
                  "exit": result.summary(), "diff": diff, "final_files": changed, "removed_files": removed,
                  "check": check, "skills_installed": [name for name, _files in skills]}
    return RolloutOutcome(hard=hard, soft=soft, fail_reason=reason, prediction=clip(str(answer or ""), 500),
                          task_type=item.get("task_type", ""), calls=list(proxy.calls), trajectory=trajectory,
                          turns=len(proxy.calls))


def check_recorded(env: Any, item: dict[str, Any], trajectory: Any, result: Any) -> str | None:
    """What does not hold in a recorded harness rollout (verification; None when it all does): the trajectory
    must be this item's, with one proxy exchange per recorded call; the final workspace it records (the
    starting files, the changed ones written over them, the removed ones gone) must give the recorded diff,
    and the task's check, run again on it, the recorded result and score."""
    from skillstate.envs.workspace.env import _diff, _write_files

    if not isinstance(trajectory, dict) or trajectory.get("item_id") != item["id"] or "final_files" not in trajectory:
        return "its trajectory is not a harness rollout of this item"
    if len(trajectory.get("exchanges") or []) != len(result.calls):
        return (f"its trajectory records {len(trajectory.get('exchanges') or [])} model calls, its event "
                f"{len(result.calls)}")
    files = {p: t for p, t in item["files"].items() if p not in set(trajectory.get("removed_files") or [])}
    files.update(trajectory["final_files"])
    if _diff(item["files"], files, env.max_diff_chars) != trajectory.get("diff"):
        return "its diff is not that of the final workspace it records"
    with tempfile.TemporaryDirectory(prefix="skillstate-verify-") as tmp:
        root = Path(tmp) / "workspace"
        _write_files(root, files)
        check = env._check(root, item)
    recorded = trajectory.get("check") or {}
    if check["exit_code"] != recorded.get("exit_code"):
        return f"the check now gives {check['result']}, the log {recorded.get('result')}"
    passed = check["exit_code"] == 0 and not str(result.fail_reason).startswith("rollout_error")
    if passed != (result.hard >= 1.0):
        return f"the check {'passes' if passed else 'fails'} but the event scores it {result.hard:g}"
    return None
