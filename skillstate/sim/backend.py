"""The sim backend: one LLMClient that plays both the target and the optimizer.

Which role a request is for is read off the request itself: optimizer
prompts carry tagged sections (`<failures>`, `<patches>`, ...), target
requests are a skill plus a question. Every reply is a deterministic function
of the request, so a sim run is reproducible bit for bit.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from skillstate.llm.base import ChatRequest, ChatResponse
from skillstate.sim.world import HARMS, USELESS, SimWorld
from skillstate.util import hash_value, seeded_rng


def _between(text: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.DOTALL)
    return match.group(1) if match else None


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class SimOptimizer:
    """Proposes, merges and ranks edits the way a fallible LLM might."""

    def __init__(self, world: SimWorld):
        self.world = world

    def reply(self, prompt: str, rng) -> str:
        skill = _between(prompt, "skill") or ""
        if _between(prompt, "failures") is not None:
            return self._failure_analyst(skill, _json(_between(prompt, "failures")) or [], self._budget(prompt), rng)
        if _between(prompt, "successes") is not None:
            return self._success_analyst(skill, _json(_between(prompt, "successes")) or [], rng)
        if _between(prompt, "failure_patch") is not None:
            fail = _json(_between(prompt, "failure_patch")) or {}
            succ = _json(_between(prompt, "success_patch")) or {}
            return self._merge([fail, succ], rng)  # failure edits come first, so they win duplicates
        if _between(prompt, "patches") is not None:
            return self._merge(_json(_between(prompt, "patches")) or [], rng)
        if _between(prompt, "edits") is not None:
            return self._rank(_json(_between(prompt, "edits")) or [], self._budget(prompt), rng)
        return "I am not sure what you are asking."

    @staticmethod
    def _budget(prompt: str) -> int:
        match = re.search(r"at most (\d+) edits|Only (\d+) of the candidate edits", prompt)
        return int(next(g for g in match.groups() if g)) if match else 3

    def _rule_edit(self, skill: str, text: str) -> dict[str, str]:
        if "## Rules" in skill:
            return {"op": "insert_after", "target": "## Rules", "content": f"- {text}"}
        return {"op": "append", "target": "", "content": f"- {text}"}

    def _failure_analyst(self, skill: str, failures: list[dict], budget: int, rng) -> str:
        if rng.random() < 0.06:
            return "The skill should be clearer. I would add a rule about checking answers."
        low = skill.lower()
        counts = Counter(f.get("task_type", "") for f in failures)
        edits: list[dict[str, str]] = []
        summary: list[str] = []
        for task_type, n in counts.most_common(2):  # an analyst focuses on the commonest patterns
            if len(edits) >= budget:
                break
            summary.append(f"{n} failure(s) on {task_type or 'untyped'} questions")
            harms = [h for h in HARMS if h.key in low and (not h.task_types or task_type in h.task_types)]
            if harms and rng.random() < 0.6:
                line = next((ln for ln in skill.splitlines() if harms[0].key in ln.lower()), None)
                if line:
                    edits.append({"op": "delete", "target": line, "content": ""})
                    continue
            rule = self.world.rule_for(task_type)
            if rule.key in low:
                if rng.random() < 0.4:
                    line = next(ln for ln in skill.splitlines() if rule.key in ln.lower())
                    edits.append({"op": "replace", "target": line, "content": f"{line} This matters."})
                continue
            roll = rng.random()
            if roll < 0.35:
                edits.append(self._rule_edit(skill, rng.choice(rule.variants)))
            elif roll < 0.8:
                edits.append(self._rule_edit(skill, rng.choice(USELESS)))
            else:
                edits.append(self._rule_edit(skill, rng.choice(HARMS).text))
        return json.dumps({"reasoning": f"Looked at {len(failures)} failures.", "failure_summary": summary,
                           "edits": edits})

    def _success_analyst(self, skill: str, successes: list[dict], rng) -> str:
        roll = rng.random()
        edits = []
        if 0.55 <= roll < 0.9:
            edits.append(self._rule_edit(skill, rng.choice(USELESS)))
        elif roll >= 0.9:
            edits.append(self._rule_edit(skill, HARMS[2].text))
        return json.dumps({"reasoning": f"{len(successes)} successes; the skill mostly works.",
                           "failure_summary": [], "edits": edits})

    def _key(self, edit: dict) -> str:
        content = str(edit.get("content", "")).lower()
        for key in self.world.all_rule_keys():
            if key in content:
                return f"rule:{key}"
        return f"{edit.get('op')}|{edit.get('target')}|{content}"

    def _merge(self, patches: list[dict], rng) -> str:
        if rng.random() < 0.05:
            return "Merged: keep all edits."
        seen: dict[str, dict] = {}
        for patch in patches:
            for edit in patch.get("edits", []) if isinstance(patch, dict) else []:
                seen.setdefault(self._key(edit), {k: edit.get(k, "") for k in ("op", "target", "content")})
        return json.dumps({"edits": list(seen.values())})

    def _value(self, edit: dict) -> float:
        content, op = str(edit.get("content", "")).lower(), edit.get("op")
        if op == "delete" and any(h.key in str(edit.get("target", "")).lower() for h in HARMS):
            return 2.5
        if any(key in content for key in self.world.all_rule_keys()):
            return 2.0
        if any(h.key in content for h in HARMS):
            return 0.5
        return 1.0

    def _rank(self, edits: list[dict], budget: int, rng) -> str:
        if rng.random() < 0.05:
            return "The first few look best."
        scored = sorted(((self._value(e) + rng.random() * 1.6, e.get("index", i)) for i, e in enumerate(edits)),
                        reverse=True)
        return json.dumps({"selected_indices": [idx for _, idx in scored[:budget]]})


class SimBackend:
    """LLMClient for both roles of the simulated world."""

    name = "sim"

    def __init__(self, world: SimWorld):
        self.world = world
        self.optimizer = SimOptimizer(world)

    def respond(self, messages: list[dict[str, str]]) -> str:
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        if "<skill>" in user:
            return self.optimizer.reply(user, seeded_rng("sim-optimizer", hash_value(messages)))
        return self.world.answer(system, user)

    def complete(self, request: ChatRequest) -> ChatResponse:
        messages = request.message_dicts()
        text = self.respond(messages)
        prompt_tokens = sum(_tokens(m["content"]) for m in messages)
        return ChatResponse(text=text, prompt_tokens=prompt_tokens, completion_tokens=_tokens(text),
                            finish_reason="stop")
