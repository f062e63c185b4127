"""The simulated target with progressive disclosure (`disclosure: tools`).

It plays an agent that sees installed skills by name and description:
1. It loads the skills whose description names the question's kind best: each
   kind has trigger words (`TRIGGERS`), and of the skills whose description
   holds any, it loads those with the most (a tie loads them all; none loads
   nothing and it answers unaided).
2. It reads the files a loaded SKILL.md points to on a line that names the
   question's kind, or that says to read it for every question.
3. It answers as the plain sim target does, from everything it loaded: the rules
   in the loaded bodies and the files read decide its chance, a distractor's
   harmful rule included.

Every reply is a function of the request, as the rest of the sim's are.
"""

from __future__ import annotations

import json
import re
from typing import Any

from skillstate.envs.disclosure import FILES_LINE, LOAD_SKILL, READ_FILE
from skillstate.llm.base import ToolCall
from skillstate.skilltree.links import linked_paths

# Words in a skill's description that tell the target the skill is for a kind of question.
TRIGGERS: dict[str, tuple[str, ...]] = {
    "arithmetic": ("arithmetic", "calculation"),
    "unit_conversion": ("unit", "conversion"),
    "date_reasoning": ("weekday", "date"),
    "reading": ("passage", "reading"),
    "letter_counting": ("letter", "counting"),
    "list_ordering": ("sorting", "list"),
}
# How an optimizer names a kind in a description (it holds every trigger word of the kind).
TOPICS: dict[str, str] = {
    "arithmetic": "arithmetic calculation", "unit_conversion": "unit conversion", "date_reasoning": "weekday and date",
    "reading": "reading a passage", "letter_counting": "letter counting", "list_ordering": "list sorting",
}
_EVERY = ("every question", "all questions", "always read")
_SKILL = re.compile(r"<skill>\s*<name>(.*?)</name>\s*<description>(.*?)</description>\s*</skill>", re.DOTALL)


def triggers(task_type: str, table: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    return ((table or {}).get(task_type) or TRIGGERS.get(task_type)
            or tuple(w for w in task_type.lower().split("_") if len(w) > 2) or ("general",))


def topic(task_type: str) -> str:
    return TOPICS.get(task_type) or " ".join(triggers(task_type))


def hits(description: str, task_type: str, table: dict[str, tuple[str, ...]] | None = None) -> int:
    low = description.lower()
    return sum(1 for word in triggers(task_type, table) if word in low)


def catalogue_of(system: str) -> dict[str, str]:
    """name -> description of the skills a disclosure system prompt lists."""
    return {m.group(1).strip(): m.group(2).strip() for m in _SKILL.finditer(system)}


def to_load(catalogue: dict[str, str], task_type: str, table: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The skills the target loads for a question of `task_type`."""
    scored = {name: hits(text, task_type, table) for name, text in catalogue.items()}
    best = max(scored.values(), default=0)
    return sorted(name for name, n in scored.items() if best and n == best)


def to_read(body: str, task_type: str, table: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The files a loaded SKILL.md points to on a line that names `task_type` (or every question)."""
    words = triggers(task_type, table)
    out: list[str] = []
    for line in body.splitlines():
        if line.startswith(FILES_LINE):  # the listing load_skill adds, not the skill's own pointer
            continue
        low = line.lower()
        if any(w in low for w in words) or any(e in low for e in _EVERY):
            out.extend(p for p in linked_paths(line) if p not in out)
    return out


def calls_made(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """(tool, arguments, output) of every tool call in the conversation so far."""
    outputs = {m.get("tool_call_id"): str(m.get("content") or "") for m in messages if m.get("role") == "tool"}
    made = []
    for m in messages:
        for call in m.get("tool_calls") or [] if m.get("role") == "assistant" else []:
            fn = call.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {}
            made.append((fn.get("name", ""), args if isinstance(args, dict) else {}, outputs.get(call.get("id"), "")))
    return made


def skill_calls(messages: list[dict[str, Any]], task_type: str,
                table: dict[str, tuple[str, ...]] | None = None) -> list[Any] | str:
    """What an agent with installed skills does next for a task of `task_type`: the `load_skill` or
    `read_skill_file` calls to make (a list), or, once it has loaded what it wants, the text it loaded (every
    loaded body and file read, which its competence then depends on)."""
    system = next((str(m["content"]) for m in messages if m["role"] == "system"), "")
    made = calls_made(messages)
    loads = [(args, out) for name, args, out in made if name == LOAD_SKILL]
    if not loads:
        wanted = to_load(catalogue_of(system), task_type, table)
        if wanted:
            return [ToolCall(f"call_load_{n}", LOAD_SKILL, json.dumps({"name": name}))
                    for n, name in enumerate(wanted)]
    bodies = [(str(args.get("name", "")), out) for args, out in loads if not out.startswith("error:")]
    reads = [out for name, _args, out in made if name == READ_FILE and not out.startswith("error:")]
    if not any(name == READ_FILE for name, _a, _o in made):
        wanted_files = [(skill, path) for skill, body in bodies for path in to_read(body, task_type, table)]
        if wanted_files:
            return [ToolCall(f"call_read_{n}", READ_FILE, json.dumps({"skill": skill, "path": path}))
                    for n, (skill, path) in enumerate(wanted_files)]
    return "\n".join([body for _name, body in bodies] + reads)


def disclosure_reply(world: Any, messages: list[dict[str, Any]], seed: int | None = None) -> tuple[str, list[Any]]:
    """The sim target's (text, tool calls) for a request of a disclosure rollout."""
    user = next((str(m["content"]) for m in messages if m["role"] == "user"), "")
    item = world.find_item(user)
    if item is None:
        return "I don't know.", []
    step = skill_calls(messages, item.get("task_type", ""))
    if isinstance(step, list):
        return "", step
    return world.answer(step, user, seed), []
