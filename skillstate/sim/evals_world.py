"""The sim world of a skill's evals (env evals): a simulated target that answers eval prompts, and a
simulated judge that grades expectations, both deterministic functions of the request.

Each check of an eval (an expectation, an `llm-rubric` statement, a typed assertion) is a rule kind
named by its text as the analysts see it. The target meets a check with a high chance when the skill
holds a line naming that check, and a low one (drawn per check) otherwise, and writes what meeting it
takes: the statement itself for the judge to find, the value a `contains` asks for, the expected output
for a pattern it matches; a `not-` check it breaks by writing the value. The judge passes a statement
when the output holds it, and gets a verdict wrong at `sim.judge_error`, drawn from the request, so each
sample draws on its own.
"""

from __future__ import annotations

import json
import re
from typing import Any

from skillstate.envs.skill_evals import EXPECTED_STATEMENT, check_label, eval_item
from skillstate.evals.spec import Assertion
from skillstate.sim.world import HARMS, RIGHT_WITH_RULE, USELESS, Harm, Rule
from skillstate.util import hash_value, unit_float

_STATEMENT = re.compile(r"^(\d+)\. (.*)$")
_QUOTED_CHECK = re.compile(r"^(not-)?(i?contains|starts-with) '(.*)'$")  # a text assertion, as `check_label` names it


class EvalsWorld:
    """The simulated target of env evals (the sim optimizer's world surface: see `sim.world.SimWorld`)."""

    harms: tuple[Harm, ...] = tuple(h for h in HARMS if not h.task_types)  # what hurts every check
    useless: tuple[str, ...] = USELESS
    noun = "evals"

    def __init__(self, env: Any):
        self.env = env
        self.items = {item["id"]: item for items in env.splits.values() for item in items}
        # longest prompts first: a prompt that holds another's is found before it
        self.by_prompt = sorted(((item["prompt"].strip(), item) for item in self.items.values()),
                                key=lambda pair: -len(pair[0]))

    # -- the optimizer's side --------------------------------------------------

    def rule_for(self, kind: str) -> Rule:
        text = kind.strip().rstrip(".") or "the task"
        base = 0.2 + 0.25 * unit_float("sim-evals-base", text)
        quoted = _QUOTED_CHECK.match(text)
        if quoted:  # a text assertion: a rule about writing (or never writing) its value
            negate, value = bool(quoted.group(1)), quoted.group(3)
            if negate:
                return Rule(kind, f"never write '{value.lower()}'", (f"Never write '{value}'.",), base)
            return Rule(kind, f"'{value.lower()}'", (f"Always include '{value}' in the output.",
                                                     f"Write '{value}' where it belongs in the output."), base)
        return Rule(kind, text.lower(), (f"Make sure that: {text}.", f"Before you answer, check this: {text}."),
                    base)

    def all_rule_keys(self) -> list[str]:
        kinds = {kind for item in self.items.values() for kind, _ in self.checks(item)}
        return [self.rule_for(k).key for k in sorted(kinds)]

    def failure_kinds(self, failure: dict[str, Any]) -> list[str]:
        """The checks a failure shown to an analyst failed."""
        failed = [str(c.get("check", "")) for c in failure.get("checks") or []
                  if isinstance(c, dict) and c.get("passed") is False]
        return failed or [str(failure.get("task_type", ""))]

    # -- the target --------------------------------------------------------------

    def checks(self, item: dict[str, Any]) -> list[tuple[str, Assertion | None]]:
        """(kind, the assertion or None for a judge's statement) of each check of an item, as the env names
        them."""
        graded = eval_item(item)
        out: list[tuple[str, Assertion | None]] = [(text, None) for text in graded.expectations]
        for assertion in graded.assertions:
            out.append((str(assertion.value), None) if assertion.type == "llm-rubric"
                       else (check_label(assertion), assertion))
        if not out and graded.expected_output.strip():
            out.append((EXPECTED_STATEMENT.format(graded.expected_output.strip()), None))
        return out

    def chance(self, skill: str, kind: str) -> float:
        low = skill.lower()
        p = RIGHT_WITH_RULE if self.rule_for(kind).key in low else self.rule_for(kind).base
        for harm in self.harms:
            if harm.key in low:
                p *= harm.factor
        return p

    def find_item(self, user_text: str) -> dict[str, Any] | None:
        return next((item for prompt, item in self.by_prompt if prompt and prompt in user_text), None)

    def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              seed: int | None = None) -> tuple[str, list[Any]]:
        from skillstate.envs.disclosure import LOAD_SKILL

        system = next((str(m["content"]) for m in messages if m["role"] == "system"), "")
        user = next((str(m["content"]) for m in messages if m["role"] == "user"), "")
        item = self.find_item(user)
        if item is None:
            return "I don't know what this task is.", []
        if any(t.get("function", {}).get("name") == LOAD_SKILL for t in tools):  # disclosure: tools
            return self._disclosed(messages, system, user, item, seed)
        return self.answer(system, item, seed), []

    def _disclosed(self, messages: list[dict[str, Any]], system: str, user: str, item: dict[str, Any],
                   seed: int | None) -> tuple[str, list[Any]]:
        """Load the skills whose description fits the task (`fits`), then answer from what was loaded."""
        from skillstate.envs.disclosure import LOAD_SKILL
        from skillstate.llm.base import ToolCall
        from skillstate.sim.disclosure import calls_made, catalogue_of

        loads = [out for name, _args, out in calls_made(messages) if name == LOAD_SKILL]
        if not loads:
            wanted = sorted(name for name, description in catalogue_of(system).items() if fits(description, user))
            if wanted:
                return "", [ToolCall(f"call_load_{n}", LOAD_SKILL, json.dumps({"name": name}))
                            for n, name in enumerate(wanted)]
        return self.answer("\n".join(out for out in loads if not out.startswith("error:")), item, seed), []

    def describe(self, old: str, missed: list[dict[str, Any]]) -> str | None:
        """A description that also names the tasks the target did not use the skill for: two words of each of
        the first two such tasks that it lacks (None when it lacks none)."""
        have = words(old)
        added: list[str] = []
        for failure in missed[:2]:
            added += [w for w in sorted(words(str(failure.get("task", ""))) - have - set(added))][:2]
        return f"{old.rstrip('. ')}; also for {', '.join(added)}." if added else None

    def answer(self, skill: str, item: dict[str, Any], seed: int | None = None) -> str:
        lines: list[str] = []
        first: list[str] = []
        whole: str | None = None
        for kind, assertion in self.checks(item):
            draw = f"{item['id']}|{kind}" if seed is None else f"{item['id']}|{kind}#{seed}"
            met = unit_float("sim-evals", draw) < self.chance(skill, kind)
            if assertion is None:
                if met:
                    lines.append(f"- {kind.strip()}")
                continue
            if assertion.type == "equals" and isinstance(assertion.value, str):
                whole = assertion.value if met != assertion.negate else whole
                continue
            witness = _witness(assertion, item)
            if witness is None:
                continue
            if met != assertion.negate:  # a plain check met, or a negated one broken
                (first if assertion.type == "starts-with" else lines).append(witness)
        if whole is not None:
            return whole
        return "\n".join(first + lines) or "Done."


_STOP = frozenset("""about also after before could does each from have here into make please some than that their
them then there these they this those what when which while will with would your should user asks shares turns text
good""".split())


def words(text: str) -> set[str]:
    """The content words of a text, as the sim agent matches a task to a skill's description."""
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4 and w not in _STOP}


def fits(description: str, task: str) -> bool:
    """Whether the sim agent loads a skill with this description for this task: they share two content words."""
    return len(words(description) & words(task)) >= 2


def _witness(assertion: Assertion, item: dict[str, Any]) -> str | None:
    """What the output holds when it meets `assertion` (for a negated one: when it breaks it)."""
    value = assertion.value
    if assertion.type in ("contains", "icontains", "starts-with") and isinstance(value, str):
        return value
    if assertion.type.endswith("-all") and isinstance(value, list):
        return " ".join(str(v) for v in value)
    if assertion.type.endswith("-any") and isinstance(value, list) and value:
        return str(value[0])
    expected = str(item.get("expected_output") or "")
    if assertion.type == "regex" and isinstance(value, str) and expected and re.search(value, expected):
        return expected
    return expected or None


def judge_reply(messages: list[dict[str, Any]], seed: int | None, error: float) -> str:
    """The sim judge's reply to a judge request (`evals.judge.judge_messages`)."""
    user = next((str(m["content"]) for m in reversed(messages) if m["role"] == "user"), "")
    output = _section(user, "output")
    lines = {line.strip() for line in output.splitlines()}
    verdicts = []
    for line in _section(user, "expectations").splitlines():
        match = _STATEMENT.match(line.strip())
        if not match:
            continue
        n, text = int(match.group(1)), match.group(2).strip()
        found = f"- {text}" in lines
        passed = found != (unit_float("sim-judge", hash_value([messages, seed, n])) < error)
        verdicts.append({"index": n, "passed": passed, "evidence": f"- {text}" if found else ""})
    return json.dumps({"verdicts": verdicts})


def _section(text: str, tag: str) -> str:
    start, end = text.find(f"<{tag}>"), text.rfind(f"</{tag}>")
    return text[start + len(tag) + 2:end].strip("\n") if 0 <= start < end else ""
