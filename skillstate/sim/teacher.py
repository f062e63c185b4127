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

    def _for_kind(self, category: str, kind: str, rng, good: float) -> dict[str, Any]:
        """A skill for tasks of `category` that failed on `kind` (the same thing for question answering; a
        kind of step, such as doors, in a text world)."""
        words = kind.replace("_", " ") or "general"
        roll = rng.random()
        if roll < good:
            return _skill(f"{words} procedure", rng.choice(self.world.rule_for(kind).variants), category or None,
                          f"a task with {words}")
        if roll < good + (1 - good) * 0.7:
            return _skill(f"{words} habit {rng.randrange(100)}", rng.choice(self.world.useless), category or None)
        harm = rng.choice(self.world.harms)
        return _skill(f"{words} shortcut", harm.text, category or None)

    def _kinds(self, failures: list[dict]) -> Counter[tuple[str, str]]:
        """(category, kind) of the failures shown, by how often."""
        return Counter((str(f.get("task_type", "")), kind) for f in failures if isinstance(f, dict)
                       for kind in self.world.failure_kinds(f))

    def _duplicate(self, bank: dict[str, Any], rng) -> dict[str, Any] | None:
        skills = [s for s in bank.get("skills", []) if isinstance(s, dict)]
        if not skills:
            return None
        s = rng.choice(skills)
        return _skill(str(s.get("title", "")).upper(), str(s.get("principle", "")), s.get("category"))

    def distill(self, bank: dict[str, Any], successes: list[dict], failures: list[dict], max_new: int, rng) -> str:
        if rng.random() < 0.05:
            return "These trajectories show that care matters."
        kinds = self._kinds(failures)
        proposals = [self._for_kind(category, kind, rng, 0.5) for (category, kind), _ in kinds.most_common(max_new)]
        if successes and rng.random() < 0.4:
            proposals.append(_skill("general care", rng.choice(self.world.useless), None))
        if rng.random() < 0.3 and (dup := self._duplicate(bank, rng)) is not None:
            proposals.insert(0, dup)
        mistakes = [{"text": f"Skipping the {kind.replace('_', ' ')} procedure", "category": category or None}
                    for (category, kind), _ in kinds.most_common(2) if kind]
        return json.dumps({"skills": proposals, "mistakes": mistakes})

    def evolve(self, bank: dict[str, Any], rates: dict[str, float], failures: list[dict], max_new: int,
               rng) -> str:
        weak = sorted(rates, key=lambda t: (rates[t], t))
        order = [pair for pair, _ in self._kinds(failures).most_common()] or [(t, t) for t in weak]
        proposals = self._refinements(bank, order, rng)
        proposals += [self._for_kind(category, kind, rng, 0.7) for category, kind in order]
        return json.dumps({"skills": proposals[:max_new]})

    def _refinements(self, bank: dict[str, Any], order: list[tuple[str, str]], rng) -> list[dict[str, Any]]:
        """Skills of the weak categories that say something harmful, each refined into the rule for one of the
        failing kinds (`refines` names the skill the refined one replaces)."""
        out = []
        for skill in bank.get("skills", []):
            if not isinstance(skill, dict) or rng.random() < 0.1:  # noticed nearly always
                continue
            text = str(skill.get("principle", "")).lower()
            pair = next((p for p in order if p[0] == (skill.get("category") or "")), None)
            if pair is not None and any(h.key in text for h in self.world.harms):
                rule = rng.choice(self.world.rule_for(pair[1]).variants)
                out.append(_skill(f"{skill.get('title', '')} (refined)", rule, skill.get("category"),
                                  str(skill.get("when_to_apply", "")), refines=str(skill.get("id", ""))))
        return out
