"""The simulated optimizer: proposes, merges and ranks edits, rewrites skills,
chooses step sizes and writes epoch guidance and memos, the way a fallible
LLM might. Which call a prompt is for is read off its tagged sections."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from skillstate.log.events import Edit
from skillstate.sim.blockers import SPOT_BY_ANALYST
from skillstate.sim.noise import OFF
from skillstate.sim.pruner import max_lines, prune_reply
from skillstate.sim.reading import OptimizerRequest
from skillstate.sim.teacher import SimTeacher
from skillstate.sim.tree_proposals import describe_edit, file_edits, move_out
from skillstate.sim.world import SimWorld
from skillstate.skillopt.editor import apply_edits
from skillstate.skilltree.bundle import view_files
from skillstate.skilltree.tree import SKILL_MD


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
    """Every optimizer call of the simulated world. Each reply is a function
    of the prompt and an rng seeded by it."""

    def __init__(self, world: SimWorld):
        self.world = world
        self.noise = getattr(world, "noise", OFF)  # the agents' worlds have no noisy mode

    def reply(self, prompt: str, rng) -> str:
        if _between(prompt, "distill_failures") is not None or _between(prompt, "evolve_failures") is not None:
            return self._teach(prompt, rng)
        skill = _between(prompt, "skill") or ""
        files = view_files(skill)  # a run that trains a skill directory shows each file in a block
        skill = files.get(SKILL_MD, skill)
        if _between(prompt, "prune_lines") is not None:
            return prune_reply(self.world, skill, max_lines(prompt), rng, self.noise,
                               _json(_between(prompt, "rejected_deletions")) or [])
        if _between(prompt, "candidate_edits") is not None:
            return self._learning_rate(_json(_between(prompt, "candidate_edits")) or [], rng)
        comparison = _json(_between(prompt, "comparison"))
        if comparison is not None and _between(prompt, "guidance") is not None:
            return self._slow_update(skill, _between(prompt, "guidance") or "", comparison, rng)
        if comparison is not None and _between(prompt, "memo") is not None:
            return self._meta_memo(skill + "\n" + (_between(prompt, "previous_skill") or ""), comparison, rng)
        if _between(prompt, "suggestions") is not None:
            return self._rewrite(skill, _json(_between(prompt, "suggestions")) or [], rng)
        if _between(prompt, "skills") is not None:
            return self._merge_skills(skill, _json(_between(prompt, "skills")) or [], rng)
        avoid, focus = self._advice(prompt)
        if _between(prompt, "failures") is not None:
            failures = _json(_between(prompt, "failures")) or []
            return self._failure_analyst(prompt, skill, failures, self._budget(prompt), rng, avoid, focus, files)
        if _between(prompt, "successes") is not None:
            if files and "`create`" in prompt and rng.random() < 0.3:  # a skill directory: now and then, tidy it
                moved = move_out(self.world, files)
                if moved:
                    return self._patch_reply(prompt, skill, "The rules work; SKILL.md can be shorter.", [], moved)
            return self._success_analyst(prompt, skill, _json(_between(prompt, "successes")) or [], rng, avoid)
        if _between(prompt, "failure_patch") is not None:
            fail = _json(_between(prompt, "failure_patch")) or {}
            succ = _json(_between(prompt, "success_patch")) or {}
            return self._merge([fail, succ], rng)  # failure edits come first, so they win duplicates
        if _between(prompt, "patches") is not None:
            return self._merge(_json(_between(prompt, "patches")) or [], rng)
        if _between(prompt, "edits") is not None:
            return self._rank(_json(_between(prompt, "edits")) or [], self._budget(prompt), rng)
        return "I am not sure what you are asking."

    def reply_to(self, request: OptimizerRequest, prompt: str, rng) -> str:
        """The reply to an optimizer request read from another layout than
        skillstate's tags (see `sim.reading`): the same analysts, merge and
        ranking, on what the request shows."""
        budget = request.budget if request.budget is not None else 3
        if request.kind == "failures":
            return self._failure_analyst(prompt, request.skill, request.trajectories, budget, rng, set(), [])
        if request.kind == "successes":
            return self._success_analyst(prompt, request.skill, request.trajectories, rng, set())
        if request.kind == "patches":
            return self._merge(request.patches, rng)  # listed failure side first, so failure edits win duplicates
        return self._rank(request.edits, budget, rng)

    def _teach(self, prompt: str, rng) -> str:
        """The skill bank's teacher (mode bank)."""
        teacher = SimTeacher(self.world)
        bank = _json(_between(prompt, "bank")) or {}
        match = re.search(r"at most (\d+) new skills", prompt)
        max_new = int(match.group(1)) if match else 3
        if _between(prompt, "evolve_failures") is not None:
            return teacher.evolve(bank, _json(_between(prompt, "evolve_rates")) or {},
                                  _json(_between(prompt, "evolve_failures")) or [], max_new, rng)
        return teacher.distill(bank, _json(_between(prompt, "distill_successes")) or [],
                               _json(_between(prompt, "distill_failures")) or [], max_new, rng)

    @staticmethod
    def _budget(prompt: str) -> int:
        match = re.search(r"at most (\d+) (?:edits|suggestions)|Only (\d+) of the candidate edits", prompt)
        return int(next(g for g in match.groups() if g)) if match else 3

    @staticmethod
    def _advice(prompt: str) -> tuple[set[str], list[str]]:
        """What the step buffer and the memo say: texts not to propose again,
        and task types to focus on."""
        avoid: set[str] = set()
        for entry in _json(_between(prompt, "previous_steps")) or []:
            for edit in entry.get("rejected_edits", []) if isinstance(entry, dict) else []:
                avoid.add(str(edit.get("content", "")).lstrip("- ").strip())
        focus: list[str] = []
        for line in (_between(prompt, "optimizer_memo") or "").splitlines():
            if line.startswith("- Avoid: "):
                avoid.add(line.removeprefix("- Avoid: ").strip())
            elif line.startswith("- Focus: "):
                focus.append(line.removeprefix("- Focus: ").strip())
        return avoid, focus

    def _rule_edit(self, skill: str, text: str) -> dict[str, str]:
        if "## Rules" in skill:
            return {"op": "insert_after", "target": "## Rules", "content": f"- {text}"}
        return {"op": "append", "target": "", "content": f"- {text}"}

    def _propose(self, skill: str, task_type: str, rng, avoid: set[str]) -> dict[str, str] | None:
        """One edit for a failing task type, or None."""
        spotted = self._spot_blocker(skill, task_type, rng)
        if spotted is not None:
            return spotted
        if self.noise.proposals_on:
            noisy = self._noisy_proposal(skill, task_type, rng)
            if noisy is not None:
                return noisy
        low = skill.lower()
        harms = [h for h in self.world.harms if h.key in low and (not h.task_types or task_type in h.task_types)]
        if harms and rng.random() < 0.6:
            line = next((ln for ln in skill.splitlines() if harms[0].key in ln.lower()), None)
            if line:
                return {"op": "delete", "target": line, "content": ""}
        rule = self.world.rule_for(task_type)
        if rule.key in low:
            if rng.random() < 0.4:
                line = next(ln for ln in skill.splitlines() if rule.key in ln.lower())
                return {"op": "replace", "target": line, "content": f"{line} This matters."}
            return None
        roll = rng.random()
        if roll < 0.35:
            text = rng.choice(rule.variants)
        elif roll < 0.8:
            text = rng.choice(self.world.useless)
        else:
            text = rng.choice(self.world.harms).text
        if text in avoid:  # told not to: think again, once
            text = rng.choice(rule.variants) if rng.random() < 0.5 else None
        return self._rule_edit(skill, text) if text else None

    def _spot_blocker(self, skill: str, task_type: str, rng) -> dict[str, str] | None:
        """Blocking mode: now and then, the deletion of a line that blocks this type (rarely noticed)."""
        low = skill.lower()
        found = next((b for b in getattr(self.world, "blockers", ()) if b.blocks == task_type and b.key in low), None)
        if found is None or rng.random() >= SPOT_BY_ANALYST:
            return None
        line = next((ln for ln in skill.splitlines() if found.key in ln.lower()), None)
        return {"op": "delete", "target": line, "content": ""} if line else None

    def _blocker_with(self, skill: str, task_type: str, edit: dict[str, str], rng) -> dict[str, str] | None:
        """Blocking mode: with the right rule for `task_type`, sometimes a broad line that overrides another
        type; None otherwise."""
        found = getattr(self.world, "blockers", ())
        if not found or self.world.rule_for(task_type).key not in str(edit.get("content", "")).lower():
            return None
        if rng.random() >= self.noise.blocking:
            return None
        low = skill.lower()
        others = [b for b in found if b.blocks != task_type and b.key not in low]
        return self._rule_edit(skill, rng.choice(others).text) if others else None

    def _noisy_proposal(self, skill: str, task_type: str, rng) -> dict[str, str] | None:
        """Noisy mode: now and then a rule that breaks another task type, or the deletion of one that breaks
        this type (rarely noticed), or a paraphrase of a rule the skill already has; None: propose as usual."""
        low = skill.lower()
        culprit = next((t for t in self.world.cross_harms if t.breaks == task_type and t.key in low), None)
        if culprit is not None and rng.random() < 0.25:
            line = next((ln for ln in skill.splitlines() if culprit.key in ln.lower()), None)
            if line:
                return {"op": "delete", "target": line, "content": ""}
        roll = rng.random()
        if roll < self.noise.harmful_edits:
            traps = [t for t in self.world.cross_harms if t.aimed == task_type and t.key not in low]
            return self._rule_edit(skill, rng.choice(traps).text) if traps else None
        if roll < self.noise.harmful_edits + self.noise.paraphrases:
            return self._paraphrase(skill, rng)
        return None

    def _paraphrase(self, skill: str, rng) -> dict[str, str] | None:
        """A rule the skill already states, in other words (it holds the same key, so it changes nothing but
        the length); None when the skill states no rule."""
        keys = self.world.all_rule_keys()
        traps = [t.key for t in self.world.cross_harms] + [h.key for h in self.world.harms]
        lines = [ln for ln in skill.splitlines() if any(k in ln.lower() for k in keys)
                 and not any(k in ln.lower() for k in traps)]
        if not lines:
            return None
        line = rng.choice(lines)
        key = next(k for k in keys if k in line.lower())
        others = [v for v in self._variants_of(key) if v.lower() not in skill.lower()]
        body = line.lstrip("- ").rstrip(".")
        text = rng.choice(others) if others else rng.choice([
            f"Remember: {body[0].lower()}{body[1:]}.", f"In short, {body[0].lower()}{body[1:]}.",
            f"{body}; this matters on every question of the kind."])
        return self._rule_edit(skill, text)

    def _variants_of(self, key: str) -> tuple[str, ...]:
        types = {item.get("task_type", "") for item in getattr(self.world, "items", {}).values()}
        return next((self.world.rule_for(t).variants for t in sorted(types) if self.world.rule_for(t).key == key), ())

    def _failure_analyst(self, prompt: str, skill: str, failures: list[dict], budget: int, rng,
                         avoid: set[str], focus: list[str], files: dict[str, str] | None = None) -> str:
        if rng.random() < 0.06:
            return "The skill should be clearer. I would add a rule about checking answers."
        counts = Counter(k for f in failures if isinstance(f, dict) for k in self.world.failure_kinds(f))
        ranked = sorted(counts.items(), key=lambda kv: (kv[0] not in focus, -kv[1], kv[0]))
        edits: list[dict[str, str]] = []
        summary: list[str] = []
        describe = describe_edit(self.world, prompt, skill, failures, rng) if budget else None
        if describe is not None:  # the skill was not even loaded: its description comes first
            edits.append(describe)
            summary.append("the target did not load the skill for some of them")
        for task_type, n in ranked[:2]:  # an analyst focuses on the commonest patterns
            if len(edits) >= budget:
                break
            summary.append(f"{n} failure(s) on {task_type or 'untyped'} {self.world.noun}")
            in_files = file_edits(self.world, files, task_type, rng) if files and "`create`" in prompt else None
            if in_files is not None:
                edits.extend(in_files)
                continue
            edit = self._propose(skill, task_type, rng, avoid)
            if edit:
                edits.append(edit)
                broad = self._blocker_with(skill, task_type, edit, rng) if len(edits) < budget else None
                if broad is not None:
                    edits.append(broad)
        return self._patch_reply(prompt, skill, f"Looked at {len(failures)} failures.", summary, edits)

    def _success_analyst(self, prompt: str, skill: str, successes: list[dict], rng, avoid: set[str]) -> str:
        if self.noise.paraphrases and rng.random() < self.noise.paraphrases:
            paraphrase = self._paraphrase(skill, rng)
            if paraphrase is not None:
                return self._patch_reply(prompt, skill, f"{len(successes)} successes; the rules work.", [],
                                         [paraphrase])
        roll = rng.random()
        edits = []
        if 0.55 <= roll < 0.9:
            text = rng.choice(self.world.useless)
            if text not in avoid:
                edits.append(self._rule_edit(skill, text))
        elif roll >= 0.9 and self.world.harms[-1].text not in avoid:  # the last harm hurts every task type
            edits.append(self._rule_edit(skill, self.world.harms[-1].text))
        return self._patch_reply(prompt, skill, f"{len(successes)} successes; the skill mostly works.", [], edits)

    @staticmethod
    def _suggestion(edit: dict[str, str]) -> str:
        if edit["op"] == "delete":
            return f"Remove the line: {edit['target']}"
        if edit["op"] == "replace":
            return f"Replace the line: {edit['target']} => {edit['content']}"
        return edit["content"].lstrip("- ")  # a rule to add is the suggestion itself

    def _patch_reply(self, prompt: str, skill: str, reasoning: str, summary: list[str], edits: list[dict]) -> str:
        """The analyst's reply in the shape its prompt asks for."""
        out: dict[str, Any] = {"reasoning": reasoning, "failure_summary": summary}
        if '"suggestions": [' in prompt:
            out["suggestions"] = [self._suggestion(e) for e in edits]
        elif '"skill": "<the whole' in prompt:
            out["skill"] = _apply(skill, edits)
        else:
            out["edits"] = edits
        return json.dumps(out)

    def _rewrite(self, skill: str, suggestions: list, rng) -> str:
        if rng.random() < 0.06:
            return "Here is the improved skill: it now covers every case."
        edits = []
        for s in (x for x in suggestions if isinstance(x, str)):
            if s.startswith("Remove the line: "):
                edits.append({"op": "delete", "target": s.removeprefix("Remove the line: "), "content": ""})
            elif s.startswith("Replace the line: ") and " => " in s:
                target, content = s.removeprefix("Replace the line: ").split(" => ", 1)
                edits.append({"op": "replace", "target": target, "content": content})
            else:
                edits.append(self._rule_edit(skill, s.removeprefix("Add the rule: ")))
        return json.dumps({"reasoning": f"Applied {len(edits)} suggestions.", "skill": _apply(skill, edits)})

    def _merge_skills(self, skill: str, versions: list, rng) -> str:
        if rng.random() < 0.05:
            return "Both versions are good; use either."
        texts = [(v.get("source", ""), str(v.get("skill", ""))) for v in versions if isinstance(v, dict)]
        if not texts:
            return json.dumps({"skill": skill})
        base = set(skill.splitlines())
        lines = texts[0][1].splitlines()
        for source, text in texts[1:]:
            other = text.splitlines()
            for line in other:
                if line and line not in base and line not in lines:
                    at = lines.index("## Rules") + 1 if "## Rules" in lines else len(lines)
                    lines.insert(at, line)
            if source == "failure":
                lines = [ln for ln in lines if ln not in base or ln in other or not ln.strip()]
        return json.dumps({"skill": "\n".join(lines) + "\n"})

    def _value(self, edit: dict) -> float:
        content, op = str(edit.get("content", "")).lower(), edit.get("op")
        if op == "delete" and any(h.key in str(edit.get("target", "")).lower() for h in self.world.harms):
            return 2.5
        if op == "describe":  # a skill the target does not load cannot help: a ranker sees that
            return 2.0
        if op == "insert_after" and "follow [references/" in content:  # a pointer to a reference
            return 1.8
        if any(key in content for key in self.world.all_rule_keys()):
            return 2.0
        if any(h.key in content for h in self.world.harms):
            return 0.5
        return 1.0

    def _learning_rate(self, edits: list, rng) -> str:
        roll = rng.random()
        if roll < 0.06:
            return "Apply a moderate number of edits."
        if roll < 0.1:
            return json.dumps({"reasoning": "Apply everything.", "num_edits": 99})
        good = sum(1 for e in edits if isinstance(e, dict) and self._value(e) >= 2)
        k = max(good, 1 if edits else 0) + (1 if rng.random() < 0.2 else 0)
        return json.dumps({"reasoning": f"{good} of {len(edits)} edits look well supported.", "num_edits": k})

    def _troubled_types(self, comparison: list) -> list[str]:
        bad = Counter(c.get("task_type", "") for c in comparison
                      if isinstance(c, dict) and c.get("label") in ("regressed", "persistent_fail"))
        return [t for t, _ in bad.most_common()]

    def _slow_update(self, skill: str, guidance: str, comparison: list, rng) -> str:
        if rng.random() < 0.06:
            return "Keep going; the skill is improving."
        low = skill.lower()
        keys = self.world.all_rule_keys()
        lines = [ln for ln in guidance.splitlines() if any(k in ln.lower() for k in keys)]
        for task_type in self._troubled_types(comparison)[:2]:
            rule = self.world.rule_for(task_type)
            if rule.key not in low and rng.random() < 0.5:
                lines.append(f"- {rng.choice(rule.variants)}")
        if not lines:
            lines = ["- Keep following the rules above; they worked across the last epoch."]
        return json.dumps({"reasoning": f"{len(comparison)} compared items.", "guidance": "\n".join(lines)})

    def _meta_memo(self, skills: str, comparison: list, rng) -> str:
        """Lines seen in either skill that do not help, and the task types still failing."""
        if rng.random() < 0.06:
            return "Memo: be careful."
        low = skills.lower()
        lines = [f"- Avoid: {text}" for text in self.world.useless if text.lower() in low]
        lines += [f"- Avoid: {h.text}" for h in self.world.harms if h.key in low]
        lines += [f"- Focus: {t}" for t in self._troubled_types(comparison)[:3]]
        return json.dumps({"memo": "\n".join(lines)})

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
                keys = ("op", "target", "content", "file") if edit.get("file") else ("op", "target", "content")
                seen.setdefault(self._key(edit), {k: edit.get(k, "") for k in keys})
        return json.dumps({"edits": list(seen.values())})

    def _rank(self, edits: list[dict], budget: int, rng) -> str:
        if rng.random() < 0.05:
            return "The first few look best."
        if self.noise.rank_noise:  # noisy mode: the value counts for less, 1 - rank_noise of what it did
            signal = 1.0 - self.noise.rank_noise
            scored = sorted(((signal * self._value(e) + rng.random() * 1.6, e.get("index", i))
                             for i, e in enumerate(edits)), reverse=True)
        else:
            scored = sorted(((self._value(e) + rng.random() * 1.6, e.get("index", i))
                             for i, e in enumerate(edits)), reverse=True)
        return json.dumps({"selected_indices": [idx for _, idx in scored[:budget]]})


def _apply(skill: str, edits: list[dict]) -> str:
    text, _ = apply_edits(skill, [Edit(op=e["op"], target=e.get("target", ""), content=e.get("content", ""))
                                  for e in edits])
    return text
