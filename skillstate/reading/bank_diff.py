"""What changed between two skill banks: the skills added, dropped and
refined, and the common mistakes added and dropped. A refined skill is one
kept under the same id with other text, or a new skill whose
`provenance.refines` names a skill of the first bank that the second no
longer holds; each comes with a unified diff of its text. Pure: banks in,
plain data out (the CLI draws it as a table, the dashboard as HTML)."""

from __future__ import annotations

import difflib
from typing import Any

from skillstate.bank.skills import Bank, BankSkill, Mistake


def mistake_text(mistake: Mistake) -> str:
    """A common mistake as one line: its text, and the category it is for, if any."""
    return mistake.text + (f" ({mistake.category})" if mistake.category else "")


def _mistake_key(mistake: Mistake) -> tuple[str, str]:
    return mistake.category or "", mistake.text.casefold()


def skill_lines(skill: BankSkill) -> list[str]:
    """A skill's text as the lines its diff compares."""
    lines = [f"title: {skill.title}", f"category: {skill.category or 'general'}"]
    lines += [f"principle: {line}" for line in skill.principle.splitlines() or [""]]
    if skill.when_to_apply:
        lines += [f"when: {line}" for line in skill.when_to_apply.splitlines()]
    return lines


def _row(skill: BankSkill) -> dict[str, Any]:
    return {"id": skill.id, "title": skill.title, "category": skill.category or "general",
            "principle": skill.principle, "origin": skill.provenance.origin, "step": skill.provenance.step,
            "refines": skill.provenance.refines}


def _text_diff(before: BankSkill, after: BankSkill) -> list[str]:
    return [line.rstrip("\n") for line in difflib.unified_diff(
        skill_lines(before), skill_lines(after), fromfile=before.id, tofile=after.id, lineterm="")]


def bank_diff(before: Bank, after: Bank) -> dict[str, Any]:
    """`before` → `after`: `added`, `dropped` and `refined` skills (each refined one with `before`, `after` and
    its unified `diff` lines), `mistakes_added` and `mistakes_dropped` (as text), and `same` (the skills
    unchanged)."""
    old = {s.id: s for s in before.skills}
    new = {s.id: s for s in after.skills}
    refined: list[dict[str, Any]] = []
    replaced: set[str] = set()
    added: list[dict[str, Any]] = []
    for skill in after.skills:
        if skill.id in old:
            if skill_lines(old[skill.id]) != skill_lines(skill):
                refined.append({"before": _row(old[skill.id]), "after": _row(skill),
                                "diff": _text_diff(old[skill.id], skill)})
            continue
        origin = skill.provenance.refines
        if origin in old and origin not in new and origin not in replaced:
            replaced.add(origin)
            refined.append({"before": _row(old[origin]), "after": _row(skill),
                            "diff": _text_diff(old[origin], skill)})
        else:
            added.append(_row(skill))
    dropped = [_row(s) for s in before.skills if s.id not in new and s.id not in replaced]
    old_m = {_mistake_key(m): m for m in before.mistakes}
    new_m = {_mistake_key(m): m for m in after.mistakes}
    return {
        "added": added, "dropped": dropped, "refined": refined,
        "same": sum(1 for s in after.skills if s.id in old and skill_lines(old[s.id]) == skill_lines(s)),
        "mistakes_added": [mistake_text(m) for k, m in new_m.items() if k not in old_m],
        "mistakes_dropped": [mistake_text(m) for k, m in old_m.items() if k not in new_m],
        "size_before": len(before.skills), "size_after": len(after.skills),
    }


def is_empty(diff: dict[str, Any]) -> bool:
    return not any(diff[k] for k in ("added", "dropped", "refined", "mistakes_added", "mistakes_dropped"))
