"""External agents as the target of workspace tasks: Codex, Claude Code, Qwen Code, or any command.

`env_config.harness.kind` selects who acts. `builtin` is skillstate's own coding agent (env.py). Any
other kind runs an agent program in the rollout's workspace, in the sandbox, for each rollout:
1. the run's skills are installed where that agent looks for them (`skills_dir`, e.g. `.agents/skills/`),
   the trained one with its current text beside any distractors;
2. a journaling proxy (`proxy.server`) is started for the rollout, and the agent is pointed at it with a key
   made for the rollout: each of its model calls becomes one journaled target call of the run;
3. the agent runs non-interactively with the task, within its own time and memory limits;
4. its output (an event stream of JSON lines, for the presets) is the trajectory's `events`, and the
   task's check scores what it left in the workspace (the installed skills removed first).

A preset knows its agent's command line, where it looks for skills, which API it speaks and where it
keeps its own state (always inside the sandbox's private /tmp, never in the workspace). `command` runs
any program, with the contract in docs/workspace.md: the task as `{task}` in its arguments (or on
stdin when none names it), the workspace as its working directory, the skills under `.agents/skills/`,
and the proxy's URLs in OPENAI_BASE_URL and ANTHROPIC_BASE_URL.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skillstate.errors import ConfigError
from skillstate.skilltree.paths import check_path

PROXY_PORT = 4141  # where the bridge serves the proxy inside the sandbox's own network namespace
PROXY_SOCKET = "/tmp/.skillstate-proxy.sock"  # where the proxy's socket is bound inside the sandbox
MAX_EVENTS = 400  # events of an agent's stream kept in the trajectory (its last ones)
MAX_EVENT_CHARS = 4_000  # characters of one event kept


@dataclass(frozen=True)
class Preset:
    """How to run one agent CLI: `argv(executable, task, base_url, model)`, the environment it needs (its
    own state under `private`, a directory of the sandbox's own) and where it looks for skills in a project."""

    executable: str
    skills_dir: str
    package: str  # where it comes from (npm), for the error that says it is not installed
    model: str  # the model name it is given unless the config names one: a name it accepts
    argv: Callable[[str, str, str, str], list[str]]
    env: Callable[[str, str], dict[str, str]]  # (base_url, private dir) -> variables


def _codex_argv(exe: str, task: str, url: str, model: str) -> list[str]:
    provider = f'{{name="skillstate",base_url="{url}",env_key="SKILLSTATE_PROXY_KEY",wire_api="responses"}}'
    return [exe, "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-c", "model_provider=skillstate", "-c", f"model_providers.skillstate={provider}", "-m", model, task]


def _claude_argv(exe: str, task: str, url: str, model: str) -> list[str]:
    return [exe, "-p", task, "--output-format", "stream-json", "--verbose", "--model", model,
            "--dangerously-skip-permissions"]


def _qwen_argv(exe: str, task: str, url: str, model: str) -> list[str]:
    return [exe, "--auth-type", "openai", "--openai-base-url", url, "-m", model, "-o", "stream-json", "--yolo",
            "-p", task]


PRESETS: dict[str, Preset] = {
    # The sandbox is skillstate's, so the agent's own (and its approval prompts) are off.
    # Codex: the Responses API, streaming
    "codex": Preset("codex", ".agents/skills", "@openai/codex", "skillstate", _codex_argv,
                    lambda url, private: {"CODEX_HOME": f"{private}/codex-home"}),
    # Claude Code: Anthropic Messages, streaming
    "claude": Preset("claude", ".claude/skills", "@anthropic-ai/claude-code", "sonnet", _claude_argv,
                     lambda url, private: {"ANTHROPIC_BASE_URL": url.removesuffix("/v1"),
                                           "CLAUDE_CONFIG_DIR": f"{private}/claude-home",
                                           "IS_SANDBOX": "1",  # it is one (skillstate's), so skipping its
                                           # permission prompts is allowed even for a root driver
                                           "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
                                           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}),
    # Qwen Code: chat completions, streaming
    "qwen": Preset("qwen", ".qwen/skills", "@qwen-code/qwen-code", "skillstate", _qwen_argv,
                   lambda url, private: {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}),
}
UNSUPPORTED = {
    "gemini": "Gemini CLI asks Google's Generative Language API, which the proxy does not speak (it speaks OpenAI "
              "chat completions, the Responses API and Anthropic Messages); run it as kind: command behind a "
              "translating gateway of your own",
    "opencode": "no preset yet; OpenCode speaks OpenAI chat completions, so kind: command with an opencode.json "
                "provider whose baseURL is $OPENAI_BASE_URL runs it",
}


class HarnessSettings(BaseModel):
    """`env_config.harness` of a workspace environment: who acts on the tasks."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["builtin", "command", "codex", "claude", "qwen", "gemini", "opencode"] = Field(
        "builtin", description="builtin: skillstate's own coding agent; codex, claude, qwen: that CLI (on PATH); "
                               "command: any program (`command`)")
    command: list[str] = Field(
        default_factory=list, description="command: the agent's argv, `{task}` replaced by the task (when no "
                                          "argument holds it, the task is its stdin); a preset: its executable "
                                          "(default: the CLI's name on PATH)")
    skills_dir: str | None = Field(None, description="Where the skills are installed in the workspace (default: "
                                                     "where the agent looks; .agents/skills for command).")
    wall_seconds: float = Field(600.0, gt=0, le=24 * 3600, description="Kill the agent after this long (seconds).")
    memory_mb: int = Field(4096, ge=256, le=1_048_576,
                           description="Memory the agent may use (MB), its in-memory folders included: in a memory "
                                       "cgroup, where the driver can make one (root).")
    address_space_mb: int = Field(32_768, ge=256, le=1_048_576,
                                  description="The agent's address space (MB): what it may reserve, not what it uses. "
                                              "Node.js reserves many GB for WebAssembly (its HTTP client), so a Node "
                                              "CLI's requests fail below about 32 GB.")
    proxy_max_body_mb: int = Field(16, ge=1, le=1024,
                                   description="The largest request body the journaling proxy takes from the agent "
                                               "(MB; a larger one is answered 413). An agent CLI's requests, its whole "
                                               "conversation and tools each time, are a few MB at most.")
    model: str | None = Field(None, description="The model name the agent is given (the proxy answers with the "
                                                "run's target model whatever the agent names); default: one the "
                                                "agent accepts (sonnet for Claude Code, else skillstate).")
    show: list[str] = Field(default_factory=list, description="Directories the sandbox hides (your home, the "
                                                              "working directory) that the agent needs, read-only: "
                                                              "where you installed it, say.")

    @field_validator("kind")
    @classmethod
    def _supported(cls, kind: str) -> str:
        if kind in UNSUPPORTED:
            raise ValueError(f"harness {kind}: {UNSUPPORTED[kind]}")
        return kind

    @model_validator(mode="after")
    def _preset_command(self) -> HarnessSettings:
        if self.kind in PRESETS and len(self.command) > 1:
            raise ValueError(f"harness {self.kind}: command is the CLI's executable alone (its arguments are the "
                             "preset's); for a command line of your own, use kind: command")
        return self

    @field_validator("skills_dir")
    @classmethod
    def _skills_dir(cls, value: str | None) -> str | None:
        if value is not None:
            check_path(value)
        return value

    @field_validator("show")
    @classmethod
    def _show(cls, value: list[str]) -> list[str]:
        for path in value:
            if not os.path.isabs(path):
                raise ValueError(f"show: {path!r} is not an absolute path")
        return value

    @property
    def external(self) -> bool:
        return self.kind != "builtin"

    def installs_at(self) -> str:
        return self.skills_dir or (PRESETS[self.kind].skills_dir if self.kind in PRESETS else ".agents/skills")

    def executable(self) -> str:
        """The agent program's path on this machine; a one-line ConfigError when it is not installed."""
        if self.kind == "command":
            if not self.command:
                raise ConfigError("env_config.harness.command: give the agent's command (a list of arguments)")
            name = self.command[0]
        else:
            name = self.command[0] if self.command else PRESETS[self.kind].executable
        found = shutil.which(name)
        if found is None:
            hint = f" (npm install -g {PRESETS[self.kind].package})" if self.kind in PRESETS else ""
            raise ConfigError(f"harness {self.kind}: {name!r} is not an executable on PATH{hint}")
        return found


@dataclass(frozen=True)
class Launch:
    """One agent run's argv, environment and stdin."""

    argv: list[str]
    env: dict[str, str]
    stdin: str | None


def launch(settings: HarnessSettings, task: str, base_url: str, private: str, skills_dir: str, key: str) -> Launch:
    """How to start the agent for `task`, its model at `base_url` with the rollout's proxy `key`, its own state
    (its HOME among it) under `private`, never in the workspace."""
    exe = settings.executable()
    model = settings.model or (PRESETS[settings.kind].model if settings.kind in PRESETS else "skillstate")
    common = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "HOME": f"{private}/home",
              "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": key,
              "SKILLSTATE_PROXY_KEY": key, "SKILLSTATE_MODEL": model,
              "SKILLSTATE_SKILLS_DIR": skills_dir, "SKILLSTATE_TASK": task, "NO_COLOR": "1", "CI": "1"}
    if settings.kind == "command":
        args = [_absolute(a) for a in settings.command[1:]]
        named = any("{task}" in a for a in args)
        return Launch([exe, *(a.replace("{task}", task) for a in args)], common, None if named else task)
    preset = PRESETS[settings.kind]
    return Launch(preset.argv(exe, task, base_url, model), {**common, **preset.env(base_url, private)}, None)


def _absolute(arg: str) -> str:
    """An argument that names a file here (the agent's script, say) as an absolute path: the agent starts in
    the workspace, not in the directory the run was started from."""
    return str(Path(arg).resolve()) if not os.path.isabs(arg) and "{task}" not in arg and Path(arg).is_file() else arg


def shown_paths(settings: HarnessSettings) -> list[str]:
    """What the sandbox shows the agent read-only although it hides it: the config's `show`, the agent's program
    and each file its command names (a script of yours in your project, say): those files alone, never the
    folder they are in (your working directory holds the run's database and the tasks' checks)."""
    out = list(settings.show)
    named = [settings.executable(), *(_absolute(a) for a in settings.command[1:])]
    for path in named:
        if os.path.isabs(path) and os.path.isfile(path) and path not in out:
            out.append(path)
    return out


def install_skills(root: Path, skills_dir: str, skills: list[tuple[str, dict[str, str | None]]]) -> Path:
    """Write each (name, files) skill under `root/skills_dir/name/`; the directory made (removed before the
    check). A binary file (None) is skipped: the run's log holds it, the agent does not need it."""
    base = root / check_path(skills_dir)
    for name, files in skills:
        for rel, text in files.items():
            if text is None:
                continue
            target = base / check_path(name) / check_path(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    return base


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


MAX_DEPTH = 64  # nesting of a JSON value an agent sends or prints that the driver takes (real ones: a handful)


def nesting(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep `value` nests lists and dicts, looked at without recursion and no further than `limit` + 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def plain_text(value: Any) -> Any:
    """`value` with each string's lone surrogates (half an emoji cut by an agent) replaced: a log holds UTF-8.
    Built without recursion, so a value nested however deep is no hazard to the driver."""
    def fix(item: Any) -> Any:
        return item.encode("utf-8", "replace").decode("utf-8") if isinstance(item, str) else item

    if not isinstance(value, (list, dict)):
        return fix(value)
    out: Any = [] if isinstance(value, list) else {}
    stack = [(value, out)]
    while stack:
        source, target = stack.pop()
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in pairs:
            made = [] if isinstance(item, list) else {} if isinstance(item, dict) else fix(item)
            if isinstance(target, dict):
                target[fix(key)] = made
            else:
                target.append(made)
            if isinstance(item, (list, dict)):
                stack.append((item, made))
    return out


def read_events(output: str) -> tuple[list[Any], list[str]]:
    """(events, log) of an agent's output (its stdout and stderr, in order): each line that is a JSON value is an
    event (a JSON array printed whole is its events; NaN and Infinity are not JSON), the other lines its log. An
    event nested deeper than MAX_DEPTH is kept as its clipped text."""
    events: list[Any] = []
    other: list[str] = []
    for line in output.splitlines():
        text = line.strip()
        if not text:
            continue
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            other.append(line)
            continue
        if nesting(value) > MAX_DEPTH:
            events.append({"clipped": text[:MAX_EVENT_CHARS]})
            continue
        events.extend(value if isinstance(value, list) else [value])
    kept = [_clipped(plain_text(e)) for e in events[-MAX_EVENTS:]]
    return kept, plain_text(other[-50:])


def _clipped(event: Any) -> Any:
    text = json.dumps(event)
    return event if len(text) <= MAX_EVENT_CHARS else {"clipped": text[:MAX_EVENT_CHARS]}


def bridge_source() -> str:
    return (Path(__file__).parent / "bridge.py").read_text(encoding="utf-8")
