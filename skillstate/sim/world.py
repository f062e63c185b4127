"""Rules, items and the simulated target of the sim world."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from skillstate.sim.blockers import blocked, blockers
from skillstate.sim.noise import OFF, SimNoise
from skillstate.util import hash_value, seeded_rng, unit_float


@dataclass(frozen=True)
class Rule:
    task_type: str
    key: str  # lowercase phrase whose presence in the skill turns the rule on
    variants: tuple[str, ...]  # wordings the optimizer may propose; each holds `key`
    base: float  # chance of a right answer without the rule


@dataclass(frozen=True)
class Harm:
    key: str
    text: str
    factor: float  # multiplies the chance of a right answer
    task_types: tuple[str, ...]  # empty: every task type


RULES: dict[str, Rule] = {r.task_type: r for r in (
    Rule("arithmetic", "order of operations", (
        "For arithmetic, follow the order of operations: multiply and divide before adding.",
        "Evaluate arithmetic expressions with the usual order of operations (× and ÷ before + and −).",
    ), 0.40),
    Rule("unit_conversion", "conversion factor", (
        "For unit conversions, write down the conversion factor (1 km = 1000 m, 1 kg = 1000 g, 1 h = 60 min) and "
        "multiply.",
        "Convert units by multiplying by the conversion factor between them; check the result's magnitude.",
    ), 0.35),
    Rule("date_reasoning", "modulo 7", (
        "For weekday questions, count forward day by day, modulo 7, from the given day.",
        "Days of the week repeat every 7 days: add the offset modulo 7 to the starting day.",
    ), 0.30),
    Rule("reading", "only from the context", (
        "When a context is given, answer only from the context and use the exact name it uses.",
        "Answer reading questions only from the context passage, not from memory.",
    ), 0.50),
    Rule("letter_counting", "one letter at a time", (
        "To count letters in a word, spell the word out one letter at a time and count the matches.",
        "Count letters by going through the word one letter at a time.",
    ), 0.25),
    Rule("list_ordering", "comma-separated", (
        "When asked to sort items, output every item, comma-separated, in the requested order.",
        "List answers must contain all items, comma-separated, in sorted order.",
    ), 0.40),
)}

HARMS: tuple[Harm, ...] = (
    Harm("single word", "Always answer with a single word.", 0.15, ("list_ordering", "reading")),
    Harm("spell numbers out", "Never use digits; spell numbers out in words.", 0.2,
         ("arithmetic", "unit_conversion", "letter_counting")),
    Harm("without checking", "Answer as fast as possible, without checking your work.", 0.75, ()),
)

USELESS: tuple[str, ...] = (
    "Read the question carefully before answering.",
    "Be helpful, polite and precise.",
    "Think about what the user really wants.",
    "Double-check your answer before replying.",
    "Keep answers short.",
    "Stay focused on the question asked.",
)

RIGHT_WITH_RULE = 0.92


@dataclass(frozen=True)
class CrossHarm:
    """A rule that sounds right for `aimed` but breaks `breaks` (noisy mode: `sim.harmful_edits`)."""

    aimed: str
    breaks: str
    key: str
    text: str


# aimed at -> (breaks, text, key): the noisy mode's traps for the bundled task types
TRAPS: dict[str, tuple[str, str, str]] = {
    "arithmetic": ("unit_conversion", "For arithmetic, round every result to a whole number before answering.",
                   "round every result to a whole number"),
    "unit_conversion": ("arithmetic", "Work through the numbers left to right, converting as you go, so no step is "
                        "skipped.", "left to right, converting as you go"),
    "date_reasoning": ("letter_counting", "Count in steps of seven whenever you count anything, to avoid slips.",
                       "count in steps of seven"),
    "reading": ("list_ordering", "Answer with the first name or item the passage mentions, as written.",
                "first name or item"),
    "letter_counting": ("date_reasoning", "Count from the first item as 1, never 0, to avoid off-by-one errors.",
                        "count from the first item as 1"),
    "list_ordering": ("reading", "Sort the candidate answers alphabetically and give the first one.",
                      "alphabetically and give the first"),
}


def cross_harms(task_types: list[str], rule_for) -> tuple[CrossHarm, ...]:
    """Two traps per task type: one alone, one riding on the type's right rule (it lifts its own type while it
    breaks another). A type without a written trap breaks the next type in sorted order."""
    types = sorted(set(task_types))
    out = []
    for n, aimed in enumerate(types):
        if aimed in TRAPS and TRAPS[aimed][0] in types:
            breaks, text, key = TRAPS[aimed]
        else:
            breaks = types[(n + 1) % len(types)]
            words, other = aimed.replace("_", " ") or "general", breaks.replace("_", " ") or "general"
            key = f"answer {other} questions the same way"
            text = f"For {words} questions, answer {other} questions the same way, without the extra checks."
        right = rule_for(aimed).variants[0].rstrip(".")
        out.append(CrossHarm(aimed, breaks, key, text))
        out.append(CrossHarm(aimed, breaks, key, f"{right}; {text[0].lower()}{text[1:]}"))
    return tuple(out)


def generic_rule(task_type: str) -> Rule:
    words = task_type.replace("_", " ").strip() or "general"
    key = f"for {words} questions"
    return Rule(task_type, key, (
        f"For {words} questions, restate what is asked, work it out step by step, then give only the final answer.",
        f"For {words} questions, check the answer against every detail of the question before replying.",
    ), 0.40)


def bundled_skill() -> str:
    return (
        "# Question answering\n\n"
        "You answer short questions.\n\n"
        "## Rules\n"
        "- Always answer with a single word.\n"
    )


class SimWorld:
    """The answer key plus the rules that decide what the target gets right.

    Every sim world (this one, and the agents' worlds in `sim.agents`) offers
    the simulated optimizer the same surface: `rule_for`, `all_rule_keys`,
    `harms`, `useless`, `noun` and `failure_kinds`; and the sim backend
    `reply`."""

    harms: tuple[Harm, ...] = HARMS
    useless: tuple[str, ...] = USELESS
    noun = "questions"

    def __init__(self, items: list[dict[str, Any]], noise: SimNoise = OFF):
        self.items = {item["id"]: item for item in items}
        self.by_question = {item["question"].strip(): item for item in items}
        self.noise = noise
        self.cross_harms = cross_harms([i.get("task_type", "") for i in items], self.rule_for) \
            if noise.harmful_edits else ()
        self.blockers = blockers([i.get("task_type", "") for i in items]) if noise.blocking else ()

    def rule_for(self, task_type: str) -> Rule:
        return RULES.get(task_type) or generic_rule(task_type)

    def all_rule_keys(self) -> list[str]:
        types = {item.get("task_type", "") for item in self.items.values()}
        return [self.rule_for(t).key for t in sorted(types)]

    def failure_kinds(self, failure: dict[str, Any]) -> list[str]:
        """The rule kinds a failure shown to an analyst points at: here its task type."""
        return [str(failure.get("task_type", ""))]

    def reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              seed: int | None = None) -> tuple[str, list[Any]]:
        """The target's (text, tool calls) for a request; `seed` picks another sample."""
        from skillstate.envs.disclosure import LOAD_SKILL

        if any(t.get("function", {}).get("name") == LOAD_SKILL for t in tools):  # disclosure: tools
            from skillstate.sim.disclosure import disclosure_reply

            return disclosure_reply(self, messages, seed)
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        return self.answer(system, user, seed), []

    def find_item(self, user_text: str) -> dict[str, Any] | None:
        match = re.search(r"Question:\s*(.+)", user_text)
        if match and match.group(1).strip() in self.by_question:
            return self.by_question[match.group(1).strip()]
        for question, item in self.by_question.items():
            if question in user_text:
                return item
        return None

    def chance(self, skill: str, task_type: str) -> float:
        low = skill.lower()
        rule = self.rule_for(task_type)
        p = RIGHT_WITH_RULE if rule.key in low else rule.base
        for harm in HARMS:
            if harm.key in low and (not harm.task_types or task_type in harm.task_types):
                p *= harm.factor
        if self.noise.on:
            for trap in self.cross_harms:
                if trap.breaks == task_type and trap.key in low:
                    p *= self.noise.harm_factor
                    break
            if self.blockers and blocked(low, task_type, self.blockers):
                p = min(p, self.noise.block_level)
            p *= self.noise.length_factor(skill)
        return p

    def answer(self, skill: str, user_text: str, seed: int | None = None) -> str:
        item = self.find_item(user_text)
        if item is None:
            return "I don't know."
        task_type = item.get("task_type", "")
        draw = item["id"] if seed is None else f"{item['id']}#{seed}"  # each sample draws on its own
        roll = unit_float("sim-item", draw)
        if self.noise.answer_noise:  # noisy mode: a share of the answers drawn by the whole request
            request = hash_value([skill, user_text, seed])
            if unit_float("sim-noise-pick", request) < self.noise.answer_noise:
                roll = unit_float("sim-noise-draw", request)
        right = roll < self.chance(skill, task_type)
        answer = item["answers"][0] if right else self.wrong_answer(item)
        if "single word" in skill.lower():
            answer = answer.replace(",", " ").split()[0] if answer.split() else answer
        return answer

    def wrong_answer(self, item: dict[str, Any]) -> str:
        if item.get("wrong"):
            return item["wrong"]
        same = sorted(i["answers"][0] for i in self.items.values()
                      if i.get("task_type") == item.get("task_type") and i["answers"][0] != item["answers"][0])
        if same:
            return same[int(unit_float("sim-wrong", item["id"]) * len(same))]
        return "I am not sure."


# --- the bundled dataset --------------------------------------------------

_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_PEOPLE = ["Mara", "Tobin", "Ilse", "Corvin", "Anouk", "Dario", "Yelena", "Bram", "Solene", "Kasimir",
           "Petra", "Ansel", "Noor", "Teodor", "Lucia", "Emrys"]
_TOWNS = ["Harrowgate", "Velmora", "Quillon", "Ostreva", "Brindle", "Castamere", "Lowmarch", "Fennick",
          "Rysa", "Dunmore", "Aldervale", "Marrow Bay"]
_WORDS = ["banana", "mississippi", "committee", "bookkeeper", "parallel", "strawberry", "assessment",
          "balloon", "referee", "tomorrow", "successful", "occurrence", "necessary", "remember", "pepper",
          "grammar", "address", "coffee", "letter", "marmalade"]
_FRUITS = ["pear", "apple", "fig", "kiwi", "mango", "plum", "date", "lime", "grape", "cherry", "melon", "peach"]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _make(kind: str, rng) -> dict[str, Any]:
    if kind == "arithmetic":
        a, b, c = rng.randint(2, 30), rng.randint(2, 12), rng.randint(2, 12)
        return {"question": f"What is {a} + {b} × {c}?", "answers": [str(a + b * c)], "wrong": str((a + b) * c)}
    if kind == "unit_conversion":
        unit = rng.choice([("metres", "kilometres", 1000), ("grams", "kilograms", 1000), ("minutes", "hours", 60),
                           ("millilitres", "litres", 1000), ("seconds", "minutes", 60)])
        x = rng.choice([1.5, 2, 2.5, 3, 4, 4.5, 6, 7.5, 8, 12])
        small, big, f = unit
        return {"question": f"How many {small} are in {_fmt(x)} {big}? Answer with a number.",
                "answers": [_fmt(x * f)], "wrong": _fmt(x * f / 10)}
    if kind == "date_reasoning":
        d, n = rng.randrange(7), rng.randint(3, 40)
        return {"question": f"If today is {_DAYS[d]}, what day of the week will it be in {n} days?",
                "answers": [_DAYS[(d + n) % 7]], "wrong": _DAYS[(d + n + 1) % 7]}
    if kind == "reading":
        who = rng.choice(_PEOPLE)
        a, b = rng.sample(_TOWNS, 2)
        year = rng.randint(1950, 2020)
        ctx = (f"{who} grew up in {a}. In {year} {who} moved to {b} to work at the harbour, "
               f"and later wrote letters home to {a} every winter.")
        return {"question": f"According to the passage, to which town did {who} move in {year}?",
                "context": ctx, "answers": [b], "wrong": a}
    if kind == "letter_counting":
        word = rng.choice(_WORDS)
        letter = rng.choice(sorted(set(word)))
        n = word.count(letter)
        return {"question": f"How many times does the letter '{letter}' appear in the word '{word}'?",
                "answers": [str(n)], "wrong": str(n + 1)}
    if kind == "list_ordering":
        words = rng.sample(_FRUITS, 4)
        return {"question": f"Sort these words alphabetically: {', '.join(words)}.",
                "answers": [", ".join(sorted(words))], "wrong": ", ".join(words)}
    raise ValueError(kind)


def bundled_splits(sizes: dict[str, int] | None = None, seed: int = 7) -> dict[str, list[dict[str, Any]]]:
    """The sim world's dataset: six task types, generated deterministically."""
    sizes = sizes or {"train": 120, "val": 60, "test": 60}
    kinds = list(RULES)
    rng = seeded_rng("sim-dataset", seed)
    seen: set[str] = set()
    out: dict[str, list[dict[str, Any]]] = {}
    for split, size in sizes.items():
        items: list[dict[str, Any]] = []
        while len(items) < size:
            kind = kinds[len(items) % len(kinds)]
            item = _make(kind, rng)
            if item["question"] in seen:
                continue
            seen.add(item["question"])
            item.update(id=f"{split}-{len(items) + 1:03d}", task_type=kind)
            items.append(item)
        out[split] = items
    return out
