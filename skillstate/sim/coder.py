"""The simulated target as a coding agent, for workspace tasks (`env: workspace`).

It works through the environment's real tools, so the sandbox, the files and the check are real: it
lists the files, reads those the task is about, writes its change, runs the tests when its skill
says to, and calls `finish`. What it writes depends on the skill, as the other sim targets' answers
do: each kind of task has a rule (`RULES`), and with that rule in what it read it writes the task's
reference solution with a high chance; without it, it writes what an agent that does not know the
project's ways would (the item's `wrong` files, or nothing), which the check fails. With progressive
disclosure it first loads the skills whose description names the task's kind
(`sim.disclosure`), and reads the files a loaded SKILL.md points to for that kind.

Every reply is a function of the request, so runs are reproducible.
"""

from __future__ import annotations

import json
from typing import Any

from skillstate.llm.base import ToolCall
from skillstate.sim.world import Harm, Rule
from skillstate.util import unit_float

RIGHT_WITH_RULE = 0.95
RUN_TESTS = "python -m pytest -q"

RULES: dict[str, Rule] = {r.task_type: r for r in (
    Rule("bugfix", "never the tests", (
        "To fix a bug, run the tests first, find the line that causes it and fix the code, never the tests.",
        "Fix bugs in the code under tally/, never the tests: run `python -m pytest -q` before and after.",
    ), 0.35),
    Rule("money", "int number of cents", (
        "Money is an int number of cents everywhere: never use floats; round half up with integer arithmetic.",
        "Keep every amount an int number of cents (no float, no round()): use // and divmod.",
    ), 0.3),
    Rule("command", "@command(", (
        'New commands go in tally/commands.py, registered with @command("name") on a function of the ledger.',
        'A command is a function of the ledger in tally/commands.py, decorated with @command("its name").',
    ), 0.3),
    Rule("export", "__all__", (
        "A public helper is imported in tally/__init__.py and its name added to __all__.",
        "Export every public name from tally/__init__.py and list it in __all__.",
    ), 0.3),
)}

HARMS: tuple[Harm, ...] = (
    Harm("skip the tests", "To save time, skip the tests and finish as soon as you have written the change.",
         0.6, ("bugfix",)),
    Harm("smallest possible change", "Make the smallest possible change, in a new file if you can.", 0.8, ()),
)

USELESS: tuple[str, ...] = (
    "Write clean, readable code.",
    "Think step by step before you change anything.",
    "Be careful with edge cases.",
    "Follow best practices.",
)

# How a skill's description names each kind of task (the words the sim's disclosure target looks for).
TRIGGERS: dict[str, tuple[str, ...]] = {
    "bugfix": ("bug", "fix"), "money": ("money", "amount"), "command": ("command", "cli"),
    "export": ("export", "public"),
}


class CoderWorld:
    """The simulated coding agent of a workspace environment."""

    harms = HARMS
    useless = USELESS
    noun = "tasks"

    def __init__(self, env: Any):
        self.env = env
        self.by_task = {env.task_message(item).strip(): item for items in env.splits.values() for item in items}
        self.items = {item["id"]: item for item in self.by_task.values()}

    def rule_for(self, task_type: str) -> Rule:
        return RULES.get(task_type) or Rule(task_type, f"for {task_type} tasks", (
            f"For {task_type} tasks, read the files the task names before changing them.",), 0.4)

    def all_rule_keys(self) -> list[str]:
        types = {item.get("task_type", "") for item in self.by_task.values()}
        return [self.rule_for(t).key for t in sorted(types)]

    def failure_kinds(self, failure: dict[str, Any]) -> list[str]:
        return [str(failure.get("task_type", ""))]

    def chance(self, skill: str, task_type: str) -> float:
        low = skill.lower()
        rule = self.rule_for(task_type)
        p = RIGHT_WITH_RULE if rule.key.lower() in low else rule.base
        for harm in self.harms:
            if harm.key in low and (not harm.task_types or task_type in harm.task_types):
                p *= harm.factor
        return p

    def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              seed: int | None = None) -> tuple[str, list[ToolCall]]:
        from skillstate.envs.disclosure import LOAD_SKILL

        users = [str(m["content"]).strip() for m in messages if m["role"] == "user"]
        # an agent CLI sends context of its own (the date, the directory) beside the task, in user messages of
        # their own or in the task's (before it, as Claude Code's reminders are)
        task = next((u for u in users if u in self.by_task), None) or next(
            (t for u in users for t in self.by_task if u.endswith(t)), users[0] if users else "")
        item = self.by_task.get(task)
        if item is None:
            raise LookupError(f"the sim world of env {self.env.kind!r} has no task {task[:80]!r}; is the sim "
                              "server serving the run's env and env_config?")
        names = {t.get("function", {}).get("name") for t in tools}
        if "write_file" not in names or "list_files" not in names:  # not skillstate's own agent: an agent CLI
            from skillstate.sim.shell_coder import shell_reply, shell_tool

            if shell_tool(tools) is not None:
                return shell_reply(self, item, messages, tools, seed)
        if LOAD_SKILL in names:
            from skillstate.sim.disclosure import skill_calls

            step = skill_calls(messages, item.get("task_type", ""), TRIGGERS)
            if isinstance(step, list):
                return "", step
            skill = step
        else:
            skill = next((str(m["content"]) for m in messages if m["role"] == "system"), "")
        return self._act(item, skill, messages, seed)

    def _act(self, item: dict[str, Any], skill: str, messages: list[dict[str, Any]],
             seed: int | None) -> tuple[str, list[ToolCall]]:
        own = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []
               if c.get("function", {}).get("name") in ("list_files", "read_file", "write_file", "run")]
        done = [c["function"]["name"] for c in own]
        turn = sum(1 for m in messages if m["role"] == "assistant") + 1

        def call(n: int, name: str, **args: Any) -> ToolCall:
            return ToolCall(f"call_{turn}_{n}", name, json.dumps(args, sort_keys=True))

        task_type = item.get("task_type", "")
        right = unit_float("sim-coder", item["id"] if seed is None else f"{item['id']}#{seed}") < \
            self.chance(skill, task_type)
        if "list_files" not in done:
            return "", [call(1, "list_files")]
        if "read_file" not in done:
            paths = [p for p in sorted(item.get("solution") or {}) if p in item["files"]] or ["README.md"]
            return "", [call(n + 1, "read_file", path=p) for n, p in enumerate(paths)]
        if "write_file" not in done:
            files = (item.get("solution") if right else item.get("wrong")) or {}
            if files:
                return "", [call(n + 1, "write_file", path=p, content=t)
                            for n, (p, t) in enumerate(sorted(files.items()))]
        if "run" not in done and "run the tests" in skill.lower() and "skip the tests" not in skill.lower():
            return "", [call(1, "run", command=RUN_TESTS)]
        summary = "Made the change the task asks for." if right else "Made a change; I am not sure it is right."
        return "", [call(1, "finish", summary=summary)]
