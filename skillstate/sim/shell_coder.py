"""The simulated coding agent inside an agent CLI (Codex, Qwen Code, Claude Code, a command of yours).

Such a CLI offers the model its own tools, and every CLI has one that runs a shell command
(`SHELL_TOOLS`). The sim plays the CLI's model through that tool alone, as a careful agent would:
1. it lists the skills installed in the project (the front matter of each `*/skills/*/SKILL.md`);
2. it reads the SKILL.md of those whose description names the task's kind (`sim.disclosure`), then
   the files they point to for that kind;
3. it lists the project's files, reads those the task is about, writes its change (a here-document),
   runs the tests when what it read says to, and answers in text, which ends the CLI's turn.

Its competence is the coding world's (`sim.coder`): what it read decides its chance of writing the
task's reference solution. Each reply is a function of the request, so the same conversation gets
the same reply.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from skillstate.llm.base import ToolCall
from skillstate.sim.disclosure import calls_made, to_load, to_read
from skillstate.util import unit_float

# A CLI's shell tool and the argument that holds the command.
SHELL_TOOLS = {"exec_command": "cmd", "run_shell_command": "command", "Bash": "command", "bash": "command",
               "shell": "command"}
CATALOGUE = ("for f in $(find . -path '*/skills/*/SKILL.md' | sort); do echo \"=== $f\"; "
             "sed -n '2,/^---$/p' \"$f\"; done")
LIST = "find . -type f -not -path '*/.*' | sort"
RUN_TESTS = "python -m pytest -q"
EOF_MARK = "SKILLSTATE_EOF"
_FILE = re.compile(r"^=== (\S+)\s*$")


def shell_tool(tools: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(name, argument) of the request's shell tool, when it offers one of the known ones."""
    names = {t.get("function", {}).get("name") for t in tools}
    return next(((n, a) for n, a in SHELL_TOOLS.items() if n in names), None)


def _sections(output: str) -> dict[str, str]:
    """path -> text of an output made of `=== path` headers, each followed by its file's text."""
    out: dict[str, str] = {}
    current: str | None = None
    for line in output.splitlines():
        m = _FILE.match(line)
        if m:
            current = m.group(1).removeprefix("./")
            out[current] = ""
        elif current is not None:
            out[current] += line + "\n"
    return out


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}:\s*(.*)$", text, re.MULTILINE)
    return m.group(1).strip().strip("'\"") if m else ""


def _cat(paths: list[str]) -> str:
    return f"for f in {' '.join(shlex.quote(p) for p in paths)}; do echo \"=== $f\"; cat \"$f\"; done"


def _write(files: dict[str, str]) -> str:
    parts = []
    for path, text in sorted(files.items()):
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        if folder:
            parts.append(f"mkdir -p {shlex.quote(folder)}")
        parts.append(f"cat > {shlex.quote(path)} <<'{EOF_MARK}'\n{text if text.endswith(chr(10)) else text + chr(10)}"
                     f"{EOF_MARK}")
    return "\n".join(parts)


def shell_reply(world: Any, item: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                seed: int | None) -> tuple[str, list[ToolCall]]:
    """The next (text, tool calls) of the sim playing `item` through a CLI's shell tool."""
    from skillstate.sim.coder import TRIGGERS

    tool, argument = shell_tool(tools) or ("", "")
    outputs = [out for name, _args, out in calls_made(messages) if name == tool]
    task_type = item.get("task_type", "")
    turn = sum(1 for m in messages if m["role"] == "assistant") + 1
    plan: list[str] = [CATALOGUE]
    skill_text = ""
    if len(outputs) >= 1:
        found = _sections(outputs[0])
        catalogue = {_field(text, "name") or path.split("/")[-2]: _field(text, "description")
                     for path, text in found.items()}
        where = {(_field(text, "name") or path.split("/")[-2]): path for path, text in found.items()}
        chosen = [where[name] for name in to_load(catalogue, task_type, TRIGGERS) if name in where]
        if chosen:
            plan.append(_cat(chosen))
            if len(outputs) >= 2:
                bodies = _sections(outputs[1])
                skill_text = "\n".join(bodies.values())
                refs = [f"{path.rsplit('/', 1)[0]}/{ref}" for path, body in bodies.items()
                        for ref in to_read(body, task_type, TRIGGERS)]
                if refs:
                    plan.append(_cat(refs))
                    if len(outputs) >= 3:
                        skill_text += "\n" + "\n".join(_sections(outputs[2]).values())
    plan.append(LIST)
    paths = [p for p in sorted(item.get("solution") or {}) if p in item["files"]] or ["README.md"]
    plan.append(_cat(paths))
    right = unit_float("sim-coder", item["id"] if seed is None else f"{item['id']}#{seed}") < \
        world.chance(skill_text, task_type)
    files = (item.get("solution") if right else item.get("wrong")) or {}
    if files:
        plan.append(_write(files))
    low = skill_text.lower()
    if "run the tests" in low and "skip the tests" not in low:
        plan.append(RUN_TESTS)
    if len(outputs) < len(plan):
        command = plan[len(outputs)]
        return "", [ToolCall(f"call_{turn}_1", tool, json.dumps({argument: command}))]
    return ("Made the change the task asks for." if right else "Made a change; I am not sure it is right."), []
