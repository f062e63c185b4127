"""The simulated target as an agent: in a text world, and with tools.

Its competence depends on what the skill says, the way the QA sim's does.

Text worlds: the agent knows a good action sequence for the episode (the
environment's reference path, e.g. TextWorldExpress's gold path). Each step
of it has a kind (opening doors, navigating, taking objects, ...). Whether
the agent can handle a kind in an episode is decided once per (episode,
kind), with a high chance when the skill has the rule for that kind; at the
first step of a kind it cannot handle it gets stuck, says so in a `Thought:`
line and takes wasteful or invalid actions until the episode ends. Stuck
actions never change the world, so the reference path stays valid. The
analysts read those thoughts in the turns they are shown.

Tools: the agent calls the environment's reference tool calls only when the
skill tells it when to use them for that kind of question; otherwise it
answers from memory, often wrongly. It reads the answer off the tool's
output.

Every reply is a function of the request, so runs are reproducible.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from skillstate.envs.episode import EpisodeEnv
from skillstate.envs.tools import ToolEnv
from skillstate.llm.base import ToolCall
from skillstate.sim.world import Harm, Rule
from skillstate.util import hash_value, unit_float

RIGHT_WITH_RULE = 0.97

# Kinds of step in a text world: which actions they cover, the rule that teaches them.
STEP_RULES: dict[str, Rule] = {r.task_type: r for r in (
    Rule("doors", "open closed doors", (
        "Open closed doors and containers before trying to go through them or look inside (open door to X).",
        "Before moving towards a closed door, open closed doors first: the way is blocked until you do.",
    ), 0.7),
    Rule("navigation", "room by room", (
        "Explore room by room: move through each exit you have not tried yet, towards rooms you have not seen.",
        "Navigate room by room and remember which exits you already used; never go back without a reason.",
    ), 0.75),
    Rule("objects", "pick it up", (
        "As soon as you see the object the task is about, pick it up (take X / pick up X) before anything else.",
        "When the target object is in the room, pick it up right away, using its exact name.",
    ), 0.75),
    Rule("observation", "look around", (
        "When you enter a new room, look around first so you know what is there.",
        "Use look around after every move, and read the whole observation before acting.",
    ), 0.85),
    Rule("focus", "focus on", (
        "Use 'focus on X' only on the exact thing the task names, once you have found it.",
        "When the task asks you to focus on something, find it first, then focus on it exactly once.",
    ), 0.65),
    Rule("recipe", "follow the recipe", (
        "Read the cookbook, then follow the recipe step by step: slice, chop or cook each ingredient as it says.",
        "In cooking tasks, follow the recipe exactly: prepare every ingredient the way it says before the meal.",
    ), 0.65),
    Rule("devices", "activate", (
        "To heat, cool or measure something, activate the device (stove, freezer, thermometer) and use it on it.",
        "Devices do nothing until you activate them: activate the stove or sink before waiting for a change.",
    ), 0.65),
)}

STEP_PHRASES = {
    "doors": "get past closed doors and containers", "navigation": "find my way between the rooms",
    "objects": "get hold of the object", "observation": "find out what is around me",
    "focus": "tell which thing to focus on", "recipe": "prepare the ingredients", "devices": "make the devices work",
    "other": "do the next thing",
}

EPISODE_HARMS: tuple[Harm, ...] = (
    Harm("never look around", "To save time, never look around; act on what you remember.", 0.4, ("observation",)),
    Harm("different verb at random", "If an action fails, try a different verb at random.", 0.9, ()),
)

EPISODE_USELESS: tuple[str, ...] = (
    "Think about the goal before every action.",
    "Be systematic and careful.",
    "Keep track of your progress.",
    "Stay calm when an action fails.",
    "Prefer short actions.",
)


def step_kind(action: str) -> str:
    a = action.lower().strip()
    if a.startswith(("open ", "close ", "unlock ")):
        return "doors"
    if a.startswith(("move north", "move south", "move east", "move west", "go ", "go to ", "teleport")):
        return "navigation"
    if a.startswith(("look", "inventory", "read ", "examine ")):
        return "observation"
    if a.startswith("focus on"):
        return "focus"
    if a.startswith(("slice ", "chop ", "dice ", "cook ", "prepare ", "eat ")):
        return "recipe"
    if a.startswith(("activate ", "deactivate ", "use ", "pour ", "mix ", "connect ", "wait", "turn ")):
        return "devices"
    if a.startswith(("take ", "pick up ", "put ", "move ", "drop ", "put down ")):
        return "objects"
    return "other"


_PROMPT = re.compile(r"Task: (?P<goal>.*?)\n\nStarting observation:\n(?P<first>.*?)\n\n"
                     r"Actions taken so far \((?P<count>\d+)\): (?P<actions>[^\n]*)", re.DOTALL)
_STUCK = re.compile(r"not sure how to ([a-z ]+)")
_RECENT = re.compile(r"\nRecent turns:\n(?P<body>.*?)\n\nCurrent observation:", re.DOTALL)


def _recent_turns(prompt: str) -> list[tuple[str, str]]:
    """(action, observation) of the turns the prompt shows in full."""
    match = _RECENT.search(prompt)
    if match is None:
        return []
    turns: list[tuple[str, str]] = []
    for block in ("\n" + match.group("body")).split("\n> ")[1:]:
        action, _, observation = block.partition("\n")
        turns.append((action.strip(), observation))
    return turns


class EpisodeWorld:
    """The simulated agent of a text world (`EpisodeEnv`)."""

    harms = EPISODE_HARMS
    useless = EPISODE_USELESS
    noun = "steps"

    def __init__(self, env: EpisodeEnv):
        self.env = env
        self._paths: dict[str, list[dict[str, Any]]] = {}  # hash of (goal, first observation) -> candidates
        self._indexed = False
        self._lock = threading.Lock()

    # -- the optimizer's side --------------------------------------------------

    def rule_for(self, kind: str) -> Rule:
        if kind in STEP_RULES:
            return STEP_RULES[kind]
        words = kind.replace("_", " ").replace("-", " ").strip() or "these"
        return Rule(kind, f"in {words} tasks", (
            f"In {words} tasks, re-read the task before each action and check it moves you closer to the goal.",
        ), 0.5)

    def all_rule_keys(self) -> list[str]:
        return [r.key for r in STEP_RULES.values()]

    def failure_kinds(self, failure: dict[str, Any]) -> list[str]:
        """The step kinds the shown turns' thoughts say the agent was stuck on."""
        by_phrase = {phrase: kind for kind, phrase in STEP_PHRASES.items()}
        found = []
        for turn in failure.get("turns") or []:
            match = _STUCK.search(str(turn.get("reply", "")) if isinstance(turn, dict) else "")
            if match and match.group(1).strip() in by_phrase:
                found.append(by_phrase[match.group(1).strip()])
        return sorted(set(found)) or [str(failure.get("task_type", ""))]

    # -- the agent -------------------------------------------------------------

    def chance(self, skill: str, kind: str) -> float:
        low = skill.lower()
        rule = STEP_RULES.get(kind)
        p = (RIGHT_WITH_RULE if rule.key in low else rule.base) if rule else 0.7
        for harm in self.harms:
            if harm.key in low and (not harm.task_types or kind in harm.task_types):
                p *= harm.factor
        return p

    def candidates(self, goal: str, first: str) -> list[dict[str, Any]]:
        """The items whose episode starts like this one, with their reference
        paths. The first request indexes every item; the index is kept only
        once it is whole, so replies never depend on how far it got."""
        with self._lock:
            if not self._indexed:
                paths: dict[str, list[dict[str, Any]]] = {}
                for item in (i for items in self.env.splits.values() for i in items):
                    ref = self.env.reference_actions(item)
                    if ref is not None:
                        key = hash_value([ref[0].strip(), ref[1].strip()])
                        paths.setdefault(key, []).append({"item": item, "actions": ref[2]})
                self._paths, self._indexed = paths, True
            found = self._paths.get(hash_value([goal.strip(), first.strip()]))
        if not found:
            raise LookupError(f"the sim world of env {self.env.kind!r} has no task that starts like this one "
                              f"({goal.strip()[:80]!r}); is the sim server serving the run's env and env_config?")
        return found

    def observations(self, candidate: dict[str, Any]) -> list[str]:
        """What each step of a candidate's reference path shows, played once."""
        with self._lock:
            if "observations" in candidate:
                return candidate["observations"]
        session = self.env.reference_session(candidate["item"])
        try:
            seen = [session.step(a).observation for a in candidate["actions"]]
        finally:
            session.close()
        with self._lock:
            return candidate.setdefault("observations", seen)

    def path(self, goal: str, first: str, taken: list[str], recent: list[tuple[str, str]]) -> list[str]:
        """The reference path of this episode. Episodes that start alike
        (same task, same first room) are told apart by what the agent has
        seen: the first candidate whose recorded observations agree with the
        recent turns' observations."""
        found = self.candidates(goal, first)
        if len(found) == 1:
            return found[0]["actions"]
        for candidate in found:
            if self._agrees(candidate, taken, recent):
                return candidate["actions"]
        return found[0]["actions"]

    def _agrees(self, candidate: dict[str, Any], taken: list[str], recent: list[tuple[str, str]]) -> bool:
        actions, seen = candidate["actions"], self.observations(candidate)
        shown = dict(enumerate([None] * (len(taken) - len(recent)) + [obs for _, obs in recent]))
        done = 0
        for n, action in enumerate(taken):
            if done < len(actions) and action == actions[done]:
                obs = shown.get(n)
                if obs is not None and seen[done].strip()[:200] != obs.strip()[:200]:
                    return False
                done += 1
        return True

    def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              seed: int | None = None) -> tuple[str, list[ToolCall]]:  # the sim agents answer every sample alike
        skill = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        match = _PROMPT.search(user)
        if match is None:
            return "look around", []
        taken = [a.strip() for a in match.group("actions").split(" | ")] if int(match.group("count")) else []
        gold = self.path(match.group("goal"), match.group("first"), taken, _recent_turns(user))
        done = 0
        for action in taken:
            if done < len(gold) and action == gold[done]:
                done += 1
        if done >= len(gold):
            return "Action: look around", []
        episode = hash_value([match.group("goal"), match.group("first")])
        kind = step_kind(gold[done])
        if unit_float("sim-step", f"{episode}:{kind}") < self.chance(skill, kind):
            return f"Action: {gold[done]}", []
        roll = unit_float("sim-waste", f"{episode}:{len(taken)}")
        waste = "look around" if roll < 0.25 else "inventory" if roll < 0.35 else \
            ["search the room", "go back", "use door", "find the way", "try again"][int(roll * 50) % 5]
        if "different verb at random" in skill.lower() or waste == gold[done]:  # a stuck agent makes no progress
            waste = ["search the room", "use door", "try again"][int(roll * 30) % 3]
        return f"Thought: I am not sure how to {STEP_PHRASES[kind]}.\nAction: {waste}", []


# --- tool use ------------------------------------------------------------------

TOOL_HARMS: tuple[Harm, ...] = (
    Harm("guess the schema", "Guess table and column names instead of checking the schema.", 0.7, ()),
    Harm("from memory when you are confident", "Answer from memory when you are confident; tools are slow.", 0.3, ()),
)

TOOL_USELESS: tuple[str, ...] = (
    "Be precise.",
    "Think before you answer.",
    "Double-check your answer before replying.",
    "Keep answers short.",
)

BASE_TOOL_USE = 0.3  # the chance of using the tools for a kind of question with no rule for it
RIGHT_FROM_MEMORY = 0.2


class ToolWorld:
    """The simulated agent of a tool-using environment (`ToolEnv`)."""

    harms = TOOL_HARMS
    useless = TOOL_USELESS
    noun = "questions"

    def __init__(self, env: ToolEnv):
        self.env = env
        self.by_task = {env.task_message(item).strip(): item for items in env.splits.values() for item in items}

    def rule_for(self, task_type: str) -> Rule:
        words = task_type.replace("_", " ").strip() or "database"
        return Rule(task_type, f"for {words} questions, query", (
            f"For {words} questions, query the database with the sql tool and answer with the value it returns; "
            "never answer from memory.",
            f"For {words} questions, query the database first (check the schema if unsure), then copy the value "
            "from the first row of the result.",
        ), BASE_TOOL_USE)

    def all_rule_keys(self) -> list[str]:
        types = {item.get("task_type", "") for item in self.by_task.values()}
        return [self.rule_for(t).key for t in sorted(types)]

    def failure_kinds(self, failure: dict[str, Any]) -> list[str]:
        return [str(failure.get("task_type", ""))]

    def uses_tools(self, skill: str, item: dict[str, Any]) -> bool:
        low = skill.lower()
        p = RIGHT_WITH_RULE if self.rule_for(item.get("task_type", "")).key in low else BASE_TOOL_USE
        for harm in self.harms:
            if harm.key in low:
                p *= harm.factor
        return unit_float("sim-tool-use", item["id"]) < p

    def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              seed: int | None = None) -> tuple[str, list[ToolCall]]:  # the sim agents answer every sample alike
        skill = next((m["content"] for m in messages if m["role"] == "system"), "")
        task = next((m["content"] for m in messages if m["role"] == "user"), "").strip()
        item = self.by_task.get(task)
        if item is None:
            raise LookupError(f"the sim world of env {self.env.kind!r} has no task {task[:80]!r}; is the sim "
                              "server serving the run's env and env_config?")
        results = [m for m in messages if m["role"] == "tool"]
        if results:
            return self.read_output(str(results[-1].get("content") or "")), []
        reference = self.env.reference_calls(item) if tools else None
        if reference and self.uses_tools(skill, item):
            turn = sum(1 for m in messages if m["role"] == "assistant") + 1  # ids unique within the conversation
            return "", [ToolCall(id=f"call_{turn}_{n + 1}", name=name, arguments=json.dumps(args, sort_keys=True))
                        for n, (name, args) in enumerate(reference)]
        if unit_float("sim-memory", item["id"]) < RIGHT_FROM_MEMORY:
            return str(item["answers"][0]), []
        return str(item.get("wrong") or self._wrong(item)), []

    @staticmethod
    def read_output(output: str) -> str:
        try:
            data = json.loads(output)
        except json.JSONDecodeError:
            return "I could not read the result."
        rows = data.get("rows") if isinstance(data, dict) else None
        if not rows or not isinstance(rows[0], list) or not rows[0]:
            return "The query returned nothing."
        return ", ".join(str(v) for v in rows[0])

    def _wrong(self, item: dict[str, Any]) -> str:
        same = sorted({str(i["answers"][0]) for i in self.by_task.values()
                       if i.get("task_type") == item.get("task_type") and i["answers"][0] != item["answers"][0]})
        return same[int(unit_float("sim-wrong", item["id"]) * len(same))] if same else "unknown"
