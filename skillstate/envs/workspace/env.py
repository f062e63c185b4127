"""Workspace tasks: the target is a coding agent that changes a project in a directory of files.

An item is a starting workspace (`files`, path -> text), an `instruction`, and a `check`: a shell
command run in the finished workspace (exit 0 is success; a last output line `{"score": x}` gives the
soft score), after `check_files` are written into it (the tests the agent must not be able to edit
away). Each rollout works in a fresh copy of the workspace.

The agent is skillstate's own tool-calling loop over the target endpoint: it lists, reads and writes
files, runs shell commands in the sandbox (`sandbox`), and calls `finish` (or answers in text) when
done. With `disclosure: tools` it also sees the installed skills as an agent does and loads them
with `load_skill` and `read_skill_file`. The trajectory holds the conversation, what the agent
changed (a unified diff, size-capped) and the check's output.

Tool outputs are made stable (the workspace is always `/tmp/workspace` inside the sandbox, and
pytest's timings and memory addresses are masked), so a resumed or replayed run sends the same
requests and is served from the journal, as for any environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skillstate.envs.base import Complete, RolloutOutcome
from skillstate.envs.episode_loop import clip
from skillstate.envs.tools import ToolEnv, take_reply
from skillstate.envs.workspace.checking import (  # noqa: F401  (stable, SANDBOX_ROOT: re-exported)
    SANDBOX_ROOT,
    Checker,
    outcome_of,
    stable,
    with_python,
)
from skillstate.envs.workspace.files import (
    MAX_FILE_CHARS,
    Outside,
    diff_of,
    inside,
    listing,
    read_text,
    snapshot,
    write_file,
    write_files,
)
from skillstate.envs.workspace.harness import HarnessSettings
from skillstate.envs.workspace.sandbox import SandboxSettings, check_sandbox, run_command
from skillstate.envs.workspace.workspace_dir import Workspace, workspace_dir
from skillstate.envs.workspace.workspace_scan import clear_caches
from skillstate.errors import UserError
from skillstate.llm.base import CallResult
from skillstate.skilltree.paths import check_path

FINISH = "finish"

DEFAULT_SKILL = """# Coding agent

You work on a software project in a directory, through tools: list the files, read the ones that matter,
write your changes, run commands (the project's tests, for one), and call `finish` with a short summary
when the task is done.
"""


class WorkspaceItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    task_type: str = ""
    instruction: str
    files: dict[str, str]
    check: str
    check_files: dict[str, str] = {}
    check_report: Literal["exit", "junit", "json"] = "exit"

    @field_validator("files", "check_files")
    @classmethod
    def _paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            try:
                check_path(path)
            except UserError as err:
                raise ValueError(str(err).replace("the skill", "the workspace")) from None
            if "\x00" in files[path]:
                raise ValueError(f"{path} holds a NUL character (a workspace holds text files)")
        _no_file_as_directory(list(files))
        return files

    @model_validator(mode="after")
    def _checks_fit(self) -> WorkspaceItem:
        _no_file_as_directory([*self.files, *self.check_files])
        if self.check_report != "exit" and "{report}" not in self.check:
            raise ValueError(f"check_report {self.check_report}: the check must write its report to {{report}} "
                             "(pytest: --junitxml={report})")
        return self


def _no_file_as_directory(paths: list[str]) -> None:
    known = set(paths)
    for path in known:
        parts = path.split("/")
        for cut in range(1, len(parts)):
            if "/".join(parts[:cut]) in known:
                raise ValueError(f"{'/'.join(parts[:cut])!r} is both a file and the directory of {path!r}")


class WorkspaceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sandbox: SandboxSettings = SandboxSettings()
    harness: HarnessSettings = HarnessSettings()
    max_diff_chars: int = Field(20_000, ge=1_000, le=1_000_000,
                                description="Characters of the agent's diff kept in the trajectory.")
    max_record_mb: int = Field(64, ge=1, le=4096,
                               description="An external agent's changed files a rollout records for replay --verify "
                                           "(MB, names and links counted); a rollout past it is not checkable.")


TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "list_files", "description": "List the project's files (paths relative to its root).",
        "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the project.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file of the project (its whole new text; creates it if new).",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "run", "description": "Run a shell command in the project's root (sandboxed, no network); "
                                      "returns its exit code and output. `python` is the project's Python.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": FINISH, "description": "Say the task is done, with a one-paragraph summary of what you changed.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}}},
]
TOOL_NAMES = {t["function"]["name"] for t in TOOLS}


class WorkspaceEnv(ToolEnv):
    """Coding tasks in a directory, played by skillstate's built-in coding agent."""

    kind = "workspace"
    item_model = WorkspaceItem
    config_model = WorkspaceConfig
    plays_disclosure = True  # with disclosure tools, its own loop offers load_skill and read_skill_file
    installation: Any = None  # disclosure tools: the installed skills (set by envs.disclosure.disclosed)
    max_calls: int | None = None

    def __init__(self, splits: dict[str, list[dict[str, Any]]], config: BaseModel | None = None):
        super().__init__(splits, config)
        cfg = self.config if isinstance(self.config, WorkspaceConfig) else WorkspaceConfig.model_validate(
            self.config.model_dump())
        self.sandbox = cfg.sandbox
        self.harness = cfg.harness
        self.max_diff_chars = cfg.max_diff_chars
        self.max_record_mb = cfg.max_record_mb
        self.checker = Checker(self.sandbox)
        check_sandbox(self.sandbox)
        if self.harness.external:
            self.harness.executable()  # installed, or a one-line error before the run starts

    @classmethod
    def builtin_splits(cls, config: BaseModel, splits: list[str]) -> dict[str, list[dict[str, Any]]] | None:
        from skillstate.envs.workspace.tasks import bundled_splits

        return bundled_splits(splits)

    @property
    def replays_agent(self) -> bool:
        """Whether verification can re-execute a rollout against the journal: the built-in agent's requests are
        a function of the run; an external agent's are not (`engine.recorded`)."""
        return not self.harness.external

    def check_recorded(self, item: dict[str, Any], trajectory: Any, result: Any, blob: Any = None) -> str | None:
        """What does not hold in a recorded rollout of an external agent (None when it all does)."""
        from skillstate.envs.workspace.external import check_recorded

        return check_recorded(self, item, trajectory, result, blob)

    def default_skill(self) -> str:
        return DEFAULT_SKILL

    def tools(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        return TOOLS

    def task_message(self, item: dict[str, Any]) -> str:
        return f"Task: {item['instruction']}"

    def describe_item(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"id": item["id"], "task_type": item.get("task_type", ""), "instruction": item["instruction"]}

    # -- one rollout ------------------------------------------------------------------------------------

    def workspace(self) -> Any:
        """A new rollout folder with its empty workspace, bounded by `sandbox.workspace_mb` (`workspace_dir`)."""
        return workspace_dir(self.sandbox.kind, self.sandbox.workspace_mb, self.sandbox.run_as,
                             self.sandbox.workspace_files)

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str]) -> RolloutOutcome:
        with self.workspace() as box:
            write_files(box.root, item["files"])
            if self.harness.external:
                from skillstate.envs.workspace.external import external_rollout

                return external_rollout(self, box, skill, item, complete)
            return self._rollout(box, skill, item, complete, prompts)

    def _rollout(self, box: Workspace, skill: str, item: dict[str, Any], complete: Complete,
                 prompts: dict[str, str]) -> RolloutOutcome:
        root = box.root
        s = self.settings
        disclosure = self.installation is not None
        if disclosure:
            from skillstate.envs.disclosure import TOOLS as SKILL_TOOLS
            from skillstate.envs.disclosure import SkillReader

            reader = SkillReader(self.installation, skill)
            system, tools = reader.system_prompt(prompts), [*TOOLS, *SKILL_TOOLS]
        else:
            reader, system, tools = None, skill, TOOLS
        messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                          {"role": "user", "content": self.task_message(item)}]
        calls: list[CallResult] = []
        steps: list[dict[str, Any]] = []
        answer, reason, invalid_run = None, "", 0
        limit = s.max_turns
        for n in range(1, limit + 1):
            result = complete(messages, tools=tools)
            calls.append(result)
            answer, failed = take_reply(result, messages)
            if failed or answer is not None:
                reason = failed or reason
                break
            ended: list[str] = []
            for call in result.tool_calls:
                if reader is not None and reader.serves(call.name):
                    output, invalid = reader.run(call.name, call.arguments), False
                else:
                    output, invalid = self._act(root, call.name, call.arguments, box, ended)
                if call.name == FINISH and not invalid:
                    answer = output
                invalid_run = invalid_run + 1 if invalid else 0
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
                steps.append({"turn": n, "tool": call.name, "arguments": call.arguments, "output": output,
                              "invalid": invalid})
                if ended:
                    break
            if ended:  # a command passed a limit of the sandbox (the workspace's size, its memory)
                reason = f"sandbox_limit: {ended[0]}"
                break
            if answer is not None:
                break
            if invalid_run >= s.max_invalid:
                reason = f"invalid_actions: {invalid_run} failed tool calls in a row"
                break
        else:
            reason = f"max_turns: the agent did not finish within {limit} calls"
        hard, soft, reason, diff, check = self.judge(root, item, reason, box)
        trajectory = {"kind": "workspace", "item_id": item["id"], "task": item["instruction"], "answer": answer,
                      "success": hard >= 1.0, "fail_reason": reason, "steps": steps, "messages": messages,
                      "diff": diff, "check": check}
        loaded = reader.loaded if reader is not None else []
        read = reader.read if reader is not None else []
        if reader is not None:
            trajectory.update(skills_loaded=loaded, files_read=read)
        return RolloutOutcome(hard=hard, soft=soft, fail_reason=reason, prediction=clip(answer or "", 500),
                              task_type=item.get("task_type", ""), calls=calls, trajectory=trajectory,
                              turns=len(calls), skills_loaded=loaded, files_read=read)

    def judge(self, root: Path, item: dict[str, Any], reason: str,
              box: Workspace | None = None) -> tuple[float, float, str, str, dict[str, Any]]:
        """(hard, soft, fail reason, diff, check) of the finished workspace at `root`. `reason` is how the agent
        stopped (`checking.outcome_of` turns it and the check's result into the score). A workspace past its
        bounds (`box`) is not read: the rollout ends there. Compiled caches are removed first, so that the check
        runs what the diff shows."""
        passed = box.problem() if box is not None else None
        if passed is not None:
            reason = reason if reason.startswith("sandbox_limit") else f"sandbox_limit: {passed}"
            check = {"command": item["check"], "exit_code": None, "timed_out": False, "passed": False, "soft": 0.0,
                     "result": f"not run: {passed}", "output": ""}
            return 0.0, 0.0, reason, f"(not read: {passed})", check
        clear_caches(root, self.sandbox.workspace_files)
        diff = diff_of(item["files"], snapshot(root, self.sandbox.workspace_files), self.max_diff_chars)
        check = self._check(root, item, box)
        hard, soft, reason = outcome_of(check, reason)
        return hard, soft, reason, diff, check

    def _act(self, root: Path, name: str, arguments: str, box: Workspace | None = None,
             ended: list[str] | None = None) -> tuple[str, bool]:
        """(output, invalid) of one call of the agent's own tools; a command that passes a limit of the sandbox
        (the workspace's size `box` bounds, its memory) adds what it passed to `ended`."""
        if name not in TOOL_NAMES:
            return f"error: there is no tool {name!r} (tools: {', '.join(sorted(TOOL_NAMES))})", True
        try:
            args = json.loads(arguments or "{}")
        except (ValueError, RecursionError):
            return "error: the arguments are not JSON this tool can read", True
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object", True
        try:
            if name == "list_files":
                return listing(root), False
            if name == "read_file":
                path = inside(root, args.get("path"))
                text = read_text(path)
                if text is None:
                    return f"error: no regular file {args.get('path')!r}", True
                return clip(text, MAX_FILE_CHARS), False
            if name == "write_file":
                path, content = inside(root, args.get("path")), args.get("content")
                if not isinstance(content, str) or len(content) > MAX_FILE_CHARS or "\x00" in content:
                    return f"error: content must be text of at most {MAX_FILE_CHARS:,} characters", True
                write_file(root, path.relative_to(root).as_posix(), content, replace=False)
                return f"wrote {args.get('path')} ({len(content)} characters)", False
            if name == "run":
                command = args.get("command")
                if not isinstance(command, str) or not command.strip():
                    return "error: give the command to run", True
                watch = box.passed if box is not None and not box.mounted else None
                result = run_command(with_python(command), root, self.sandbox, SANDBOX_ROOT, watch=watch)
                passed = box.problem() if box is not None and result.limit is None else None
                if ended is not None and (result.limit or passed):
                    ended.append(result.summary() if result.limit else str(passed))
                invalid = result.exit_code is None and not result.timed_out and result.limit is None
                return stable(f"{result.summary()}\n{result.output}"), invalid
            summary = args.get("summary")
            return (summary if isinstance(summary, str) and summary.strip() else "done"), False
        except Outside as err:
            return f"error: {err}", True
        except (OSError, ValueError, RuntimeError) as err:  # what a file system the agent shaped can do
            return f"error: {type(err).__name__}: {getattr(err, 'strerror', None) or err}", True

    def _check(self, root: Path, item: dict[str, Any], box: Workspace | None = None) -> dict[str, Any]:
        """The check's result on the finished workspace (`checking.Checker`), watched as `box` bounds it."""
        return self.checker.check(root, item, box.passed if box is not None and not box.mounted else None)

    def reflection_view(self, trajectory: Any) -> dict[str, Any]:
        view = super().reflection_view(trajectory)
        check = trajectory.get("check") or {}
        view.update(diff=clip(str(trajectory.get("diff", "")), self.settings.max_observation_chars),
                    check={"command": check.get("command"), "result": check.get("result"),
                           "output": clip(str(check.get("output", "")), self.settings.max_observation_chars)})
        for key in ("skills_loaded", "files_read"):
            if trajectory.get(key):
                view[key] = trajectory[key]
        return view

    def check_solution(self, item: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
        """The check's result on the starting workspace with `files` written over it (tests use it to show
        that a reference solution passes)."""
        with self.workspace() as box:
            write_files(box.root, {**item["files"], **files})
            return self._check(box.root, item, box)
