"""A small coding agent of your own, as skillstate's `command` harness runs one.

It is the contract of `env_config.harness.kind: command` in code (docs/workspace.md):
- the task is its first argument (the config passes `{task}`), or its stdin;
- its working directory is the task's workspace;
- the skills are installed under $SKILLSTATE_SKILLS_DIR (one folder per skill, each with a SKILL.md);
- its model is at $OPENAI_BASE_URL (skillstate's journaling proxy), named $SKILLSTATE_MODEL, with a
  key made for this rollout in $OPENAI_API_KEY (never the run's own key).

It lists the skills by name and description in its system prompt and gives the model one tool, `bash`,
which runs a command in the workspace; the model reads a skill's SKILL.md with it when the skill fits
the task. It prints one JSON line per event (each command and its exit code, then the answer), which
skillstate keeps as the rollout's trajectory, and stops when the model answers in text.

    skillstate run --config examples/agents/shell-agent.yaml
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from openai import OpenAI

MAX_TURNS = 24
MAX_OUTPUT = 8_000
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a bash command in the project's root; returns its exit code and output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def emit(kind: str, **fields: object) -> None:
    print(json.dumps({"type": kind, **fields}), flush=True)


def skills(folder: Path) -> list[tuple[str, str, str]]:
    """(name, description, path of its SKILL.md) of each installed skill, from its front matter."""
    out = []
    for md in sorted(folder.glob("*/SKILL.md")):
        head = md.read_text(encoding="utf-8").split("\n---", 1)[0]
        fields = dict(line.split(":", 1) for line in head.splitlines()[1:] if ":" in line and not line.startswith(" "))
        out.append((fields.get("name", md.parent.name).strip(), fields.get("description", "").strip().strip("'\""),
                    md.as_posix()))
    return out


def system_prompt(folder: Path) -> str:
    lines = ["You are a coding agent working in a software project. Use the bash tool to look at files, change "
             "them and run the project's tests. When the task is done, answer with a one-paragraph summary."]
    found = skills(folder)
    if found:
        lines.append("Skills are installed for this project. Before you start, read the SKILL.md of each one whose "
                     "description fits the task (with cat), and follow it:")
        lines += [f"- {name}: {description} ({path})" for name, description, path in found]
    return "\n".join(lines)


def run(command: str) -> str:
    """Run `command` in its own process group: at 120 s the whole group is killed, whatever it started."""
    proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "killed: it ran past 120 s"
    emit("command", command=command, exit_code=proc.returncode)
    return f"exit code {proc.returncode}\n{output[-MAX_OUTPUT:]}"


def main() -> int:
    task = sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()
    client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
    model = os.environ.get("SKILLSTATE_MODEL", "skillstate")
    messages: list[dict] = [{"role": "system", "content": system_prompt(Path(os.environ.get("SKILLSTATE_SKILLS_DIR",
                                                                                             ".agents/skills")))},
                            {"role": "user", "content": task}]
    for turn in range(1, MAX_TURNS + 1):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message
        calls = reply.tool_calls or []
        messages.append({"role": "assistant", "content": reply.content or "",
                         **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
        if not calls:
            emit("answer", turn=turn, text=reply.content or "")
            return 0
        for call in calls:
            try:
                command = json.loads(call.function.arguments or "{}").get("command", "")
            except ValueError:
                command = ""
            output = run(command) if command else "error: give the command to run"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    emit("gave_up", turns=MAX_TURNS)
    return 1


if __name__ == "__main__":
    sys.exit(main())
