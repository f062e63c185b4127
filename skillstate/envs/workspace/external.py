"""One rollout of a workspace task by an external agent (`env_config.harness`; see harness.py).

The rollout installs the skills, starts the journaling proxy, runs the agent in the sandbox (under
bubblewrap, behind the bridge; without a sandbox, pointed at the proxy's local port), removes the
installed skills and scores the workspace with the task's check. The trajectory holds the agent's
event stream, each model call it made through the proxy, the conversation as the model last saw it
(its tool calls, with their outputs, are the analysts' steps), the diff, the check's result, and the
hash of the workspace's record (`workspace_record`: what `replay --verify` runs the check on again).

What holds on a crash: a rollout becomes an event only when it has finished, so a crash re-runs the
rollouts that had not; the calls they made were journaled when they were paid, so they stay counted;
an agent's requests differ from run to run (ids, dates), so a re-run is served from the journal only
where a request is the same.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from skillstate.envs.base import Complete, RolloutOutcome
from skillstate.envs.episode_loop import clip
from skillstate.envs.workspace.files import diff_of, snapshot, write_files
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
from skillstate.envs.workspace.workspace_record import BadRecord, rebuild, record_workspace, unrecorded
from skillstate.envs.workspace.workspace_scan import clear_caches, remove_tree
from skillstate.skilltree.bundle import is_bundle, unbundle
from skillstate.skilltree.frontmatter import front_matter_or_none

AGENT_OUTPUT = 400_000  # characters of an agent's output read (its event stream)
MAX_FINAL_CHARS = 2_000_000  # the bound of the changed files a trajectory held inline before workspace records
SHOWN_PATHS = 200  # changed and removed paths the trajectory names (the record holds them all)
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
                          "output": outputs.get(call.get("id"), "")})
    return steps


def _real_dir(root: Path, rel: str) -> Path | None:
    """`root/rel` when every part of it is a directory and none a symlink (what the agent may have planted
    there is never followed out of the workspace); else None."""
    here = root
    for part in Path(rel).parts:
        here = here / part
        try:
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                return None
        except OSError:
            return None
    return here


def _remove_installed(root: Path, where: str, names: list[str], item: dict[str, Any]) -> None:
    """Remove the installed skills from the workspace, following no symlink, and put back the project's own
    files they covered (a skill of the project's with an installed one's name)."""

    for name in names:
        folder = _real_dir(root, f"{where}/{name}")
        if folder is not None:
            remove_tree(folder)  # a symlink inside is removed, never what it points to; any depth
    parts = Path(where).parts
    for cut in range(len(parts), 0, -1):  # the folders the install made, where nothing else is in them now
        folder = _real_dir(root, "/".join(parts[:cut]))
        try:
            if folder is not None and not any(folder.iterdir()):
                folder.rmdir()
        except OSError:
            break
    prefix = where.rstrip("/") + "/"
    own = {p: t for p, t in item["files"].items() if any(p.startswith(f"{prefix}{n}/") for n in names)}
    if own:
        try:
            write_files(root, own)
        except (OSError, ValueError):  # the agent left something in the way: the check sees what it left
            pass


def _own_dirs(env: dict[str, str], private: str) -> set[str]:
    """The folders of the agent's own state its environment names (its HOME, a CLI's config folder)."""
    return {v for v in env.values() if v.startswith(private.rstrip("/") + "/")}


def _socket_path() -> tuple[Path, Path]:
    """Where the proxy's socket goes: a short folder of its own under /tmp (a socket's path is short, and its
    folder's name, which the sandbox's mount table shows, names nothing of the rollout's), returned second to
    be removed."""
    short = Path(tempfile.mkdtemp(prefix=f"ss-{os.getpid()}-", dir="/tmp"))
    return short / "proxy.sock", short


def external_rollout(env: Any, box: Any, skill: str, item: dict[str, Any], complete: Complete) -> RolloutOutcome:
    from skillstate.envs.workspace.checking import SANDBOX_ROOT

    h = env.harness
    root = box.root
    skills = installed_skills(env, skill)
    names = [name for name, _files in skills]
    where = h.installs_at()
    install_skills(root, where, skills)
    task = env.task_message(item)
    settings = env.sandbox.model_copy(update={"memory_mb": h.memory_mb})
    sandboxed = settings.kind == "bwrap"
    watch = None if box.mounted else box.passed
    socket_path, short = _socket_path()
    try:
        with AgentProxy(complete, socket_path if sandboxed else None, max_body=h.proxy_max_body_mb << 20) as proxy:
            if sandboxed:
                how = launch(h, task, f"http://127.0.0.1:{PROXY_PORT}/v1", "/tmp", where, proxy.key)
                dirs = ":".join(sorted(_own_dirs(how.env, "/tmp")))
                argv = [sys.executable, "-c", bridge_source(), PROXY_SOCKET, str(PROXY_PORT), dirs, "--", *how.argv]
                result = proxy.run_while(lambda: run_sandboxed(
                    argv, root, settings, SANDBOX_ROOT, env=how.env, stdin=how.stdin,
                    binds={str(socket_path): PROXY_SOCKET}, shown=shown_paths(h), wall_seconds=h.wall_seconds,
                    max_output=AGENT_OUTPUT, stop=proxy.stop, address_mb=h.address_space_mb, watch=watch))
            else:
                private = box.folder / "private"
                how = launch(h, task, proxy.base_url, str(private), where, proxy.key)
                for folder in _own_dirs(how.env, str(private)):
                    Path(folder).mkdir(parents=True, exist_ok=True)
                result = proxy.run_while(lambda: run_sandboxed(
                    how.argv, root, settings, None, env=how.env, stdin=how.stdin, wall_seconds=h.wall_seconds,
                    max_output=AGENT_OUTPUT, stop=proxy.stop, address_mb=h.address_space_mb, watch=watch))
    finally:
        remove_tree(short)
    if proxy.raised is not None:  # the run stopped taking calls (its budget, a fatal endpoint): not this rollout's
        raise proxy.raised
    passed = None if result.limit else box.problem()  # looked at whole before anything of it is read
    if passed is None:
        try:
            _remove_installed(root, where, names, item)
            clear_caches(root, env.sandbox.workspace_files)
            record = record_workspace(root, item["files"], env.max_record_mb * 1024 * 1024,
                                      env.sandbox.workspace_files)  # before the check writes its files
        except (OSError, ValueError, RecursionError) as err:  # what a workspace the agent shaped can do
            passed = f"the workspace could not be read: {type(err).__name__}: {err}"
    if passed is not None or result.limit:
        record = unrecorded(passed or result.summary())
    events, log = read_events(result.output)
    answer = next((m.get("content") for m in reversed(proxy.conversation) if m.get("role") == "assistant"
                   and m.get("content")), None)
    if proxy.failure is not None:
        reason = f"rollout_error: {proxy.failure}"
    elif result.limit or passed:
        reason = f"sandbox_limit: {result.summary() if result.limit else passed}"
    elif result.timed_out:
        reason = f"harness_timeout: the agent ran past {h.wall_seconds:g} s"
    elif result.exit_code != 0:
        reason = f"harness_failed: {result.summary()}: {clip(log[-1] if log else '', 200)}"
    elif not proxy.calls:
        reason = "harness_failed: the agent made no model call"
    else:
        reason = ""
    hard, soft, reason, diff, check = env.judge(root, item, reason, None if passed else box)
    trajectory = {"kind": "workspace", "harness": h.kind, "item_id": item["id"], "task": item["instruction"],
                  "answer": answer, "success": hard >= 1.0, "fail_reason": reason, "steps": _steps(proxy.conversation),
                  "messages": proxy.conversation, "events": events, "log": log, "exchanges": proxy.exchanges,
                  "exit": result.summary(), "diff": diff, "workspace": record.hash,
                  "workspace_bytes": record.size, "final_files_complete": record.complete,
                  **({"unrecorded": record.why} if record.why else {}),
                  "changed_files": record.changed[:SHOWN_PATHS], "changed_count": len(record.changed),
                  "removed_files": record.removed[:SHOWN_PATHS], "check": check, "skills_installed": names}
    return RolloutOutcome(hard=hard, soft=soft, fail_reason=reason, prediction=clip(str(answer or ""), 500),
                          task_type=item.get("task_type", ""), calls=list(proxy.calls), trajectory=trajectory,
                          turns=len(proxy.calls), blobs=record.blobs)


def check_recorded(env: Any, item: dict[str, Any], trajectory: Any, result: Any, blob: Any = None) -> str | None:
    """What does not hold in a recorded harness rollout (verification; None when it all does): the trajectory
    must be this item's, with one proxy exchange per recorded call; the final workspace it records must give the
    recorded diff, and the task's check, run again on it, the recorded result and score (`outcome_of`, the rule
    the rollout scored by)."""
    from skillstate.envs.workspace.checking import outcome_of

    if not isinstance(trajectory, dict) or trajectory.get("item_id") != item["id"] or (
            "final_files" not in trajectory and "workspace" not in trajectory):
        return "its trajectory is not a harness rollout of this item"
    if str(result.fail_reason).startswith("sandbox_limit") and result.hard == 0.0:
        return None  # a rollout past a bound of the sandbox scores 0 whatever its workspace holds: nothing to check
    if not trajectory.get("final_files_complete", True):
        why = trajectory.get("unrecorded") or (
            f"the agent left more than the record keeps ({trajectory.get('workspace_bytes', 0):,} bytes of changed "
            "files, names and links; env_config.max_record_mb)")
        return f"{why}, so the check cannot be run again on its final workspace (not checkable)"
    if len(trajectory.get("exchanges") or []) != len(result.calls):
        return (f"its trajectory records {len(trajectory.get('exchanges') or [])} model calls, its event "
                f"{len(result.calls)}")
    with env.workspace() as box:  # the same kind of workspace as the rollout's, within the same bounds
        root = box.root
        try:
            if "workspace" in trajectory:
                if blob is None:
                    return "the workspace record cannot be read here"
                rebuild(root, item["files"], blob(trajectory["workspace"]), blob)
            else:  # a log written before workspace records: the changed files' texts are in the trajectory
                files = {p: t for p, t in item["files"].items() if p not in set(trajectory.get("removed_files") or [])}
                files.update(trajectory["final_files"])
                write_files(root, files)
        except (BadRecord, OSError, UnicodeError, KeyError, ValueError) as err:
            return f"its workspace record cannot be rebuilt: {err}"
        if diff_of(item["files"], snapshot(root, env.sandbox.workspace_files), env.max_diff_chars) != \
                trajectory.get("diff"):
            return "its diff is not that of the final workspace it records"
        check = env._check(root, item, box)
    recorded = trajectory.get("check") or {}
    if check["exit_code"] != recorded.get("exit_code") or check.get("passed") != recorded.get(
            "passed", check.get("passed")):
        return f"the check now gives {check.get('report') or check['result']}, the log " \
               f"{recorded.get('report') or recorded.get('result')}"
    hard = outcome_of(check, str(result.fail_reason))[0]
    if hard != result.hard:
        return f"the check {'passes' if hard else 'fails'} but the event scores it {result.hard:g}"
    return None
