"""The simulated teacher of the skill bank (mode bank): distill and evolve
replies as a plausible LLM might write them. It reads the task types of the
trajectories it is shown; for a failing type it proposes the rule that
helps about half the time, else a useless or harmful line, and now and then
a skill the bank already holds (so deduplication has work). Each reply is a
function of the prompt and an rng seeded by it."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def _skill(title: str, principle: str, category: str | None, when: str = "", refines: str | None = None
           ) -> dict[str, Any]:
    return {"title": title, "principle": principle, "when_to_apply": when, "category": category,
            "refines": refines}


class SimTeacher:
    def __init__(self, world: Any):
        self.world = world

    def _for_type(self, task_type: str, rng, good: float) -> dict[str, Any]:
        words = task_type.replace("_", " ") or "general"
        roll = rng.random()
        if roll < good:
            return _skill(f"{words} procedure", rng.choice(self.world.rule_for(task_type).variants), task_type,
                          f"a {words} task")
        if roll < good + (1 - good) * 0.7:
            return _skill(f"{words} habit {rng.randrange(100)}", rng.choice(self.world.useless), task_type)
        harm = rng.choice(self.world.harms)
        return _skill(f"{words} shortcut", harm.text, task_type)

    def _duplicate(self, bank: dict[str, Any], rng) -> dict[str, Any] | None:
        skills = [s for s in bank.get("skills", []) if isinstance(s, dict)]
        if not skills:
            return None
        s = rng.choice(skills)
        return _skill(str(s.get("title", "")).upper(), str(s.get("principle", "")), s.get("category"))

    def distill(self, bank: dict[str, Any], successes: list[dict], failures: list[dict], max_new: int, rng) -> str:
        if rng.random() < 0.05:
            return "These trajectories show that care matters."
        kinds = Counter(k for f in failures if isinstance(f, dict) for k in self.world.failure_kinds(f))
        proposals = [self._for_type(kind, rng, 0.5) for kind, _ in kinds.most_common(max_new)]
        if successes and rng.random() < 0.4:
            proposals.append(_skill("general care", rng.choice(self.world.useless), None))
        if rng.random() < 0.3 and (dup := self._duplicate(bank, rng)) is not None:
            proposals.insert(0, dup)
        mistakes = [f"Skipping the {kind.replace('_', ' ')} procedure" for kind, _ in kinds.most_common(2) if kind]
        return json.dumps({"skills": proposals, "mistakes": mistakes})

    def evolve(self, bank: dict[str, Any], rates: dict[str, float], failures: list[dict], max_new: int,
               rng) -> str:
        weak = sorted(rates, key=lambda t: (rates[t], t))
        kinds = Counter(k for f in failures if isinstance(f, dict) for k in self.world.failure_kinds(f))
        order = [k for k, _ in kinds.most_common()] or weak
        return json.dumps({"skills": [self._for_type(kind, rng, 0.7) for kind in order[:max_new]]})
