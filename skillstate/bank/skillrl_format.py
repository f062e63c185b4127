"""SkillRL's own skill bank JSON, read and written.

SkillRL keeps its bank as one JSON object: `general_skills`, a list of
`{skill_id, title, principle, when_to_apply}`; the task-specific skills as
an object of category -> list of the same (`task_specific_skills`, or
`query_type_skills` in its search bank); `common_mistakes`, a list of
`{mistake_id, description, why_it_happens, how_to_avoid}`; and `metadata`.
Reading it gives a skillstate `Bank` whose skills keep SkillRL's ids and are
marked imported; writing gives that layout back. A mistake is one line in a
skillstate bank: its description, then how to avoid it; its category, which
SkillRL's mistakes do not have, is written as a `category` key of its own
and read back.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from skillstate.bank.document import read_bank
from skillstate.bank.skills import Bank, BankSkill, Mistake, SkillProvenance, skill_id
from skillstate.errors import ConfigError

TASK_KEYS = ("task_specific_skills", "query_type_skills")
_AVOID = " How to avoid: "


def is_skillrl_bank(data: Any) -> bool:
    """Whether parsed JSON has SkillRL's bank layout."""
    return (isinstance(data, dict) and isinstance(data.get("general_skills"), list)
            and any(isinstance(data.get(k), dict) for k in TASK_KEYS))


def is_bank_text(text: str) -> bool:
    """Whether a skill file's text is a bank: skillstate's bank JSON or SkillRL's."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    return is_skillrl_bank(data) or (isinstance(data, dict) and isinstance(data.get("skills"), list))


def _skill(raw: Any, category: str | None, where: str) -> BankSkill:
    if not isinstance(raw, dict) or not str(raw.get("title") or "").strip():
        raise ConfigError(f"SkillRL bank: {where}: a skill needs a title and a principle")
    title, principle = str(raw["title"]), str(raw.get("principle") or "")
    return BankSkill(id=str(raw.get("skill_id") or skill_id(title, principle, category)), title=title,
                     principle=principle, when_to_apply=str(raw.get("when_to_apply") or ""),
                     tier="general" if category is None else "task", category=category,
                     provenance=SkillProvenance(origin="import"))


def _mistake(raw: Any) -> Mistake | str:
    if not isinstance(raw, dict):
        return str(raw)
    text = str(raw.get("description") or "").strip()
    avoid = str(raw.get("how_to_avoid") or "").strip()
    line = " ".join((text + (_AVOID + avoid if avoid else "")).split())
    category = raw.get("category")  # skillstate's own key (SkillRL's mistakes are every task's)
    return Mistake(text=line, category=str(category)) if line and category else line


def from_skillrl(data: dict[str, Any]) -> Bank:
    """A skillstate bank from SkillRL's bank JSON (parsed). `ConfigError` in one line when it is malformed."""
    skills = [_skill(raw, None, f"general_skills[{i}]") for i, raw in enumerate(data["general_skills"])]
    tasks = next(data[k] for k in TASK_KEYS if isinstance(data.get(k), dict))
    for category, listed in tasks.items():
        if not isinstance(listed, list):
            raise ConfigError(f"SkillRL bank: the skills of category {category!r} are not a list")
        skills.extend(_skill(raw, str(category), f"{category}[{i}]") for i, raw in enumerate(listed))
    mistakes = data.get("common_mistakes") or []
    if not isinstance(mistakes, list):
        raise ConfigError("SkillRL bank: common_mistakes is not a list")
    try:
        return Bank(skills=tuple(skills)).with_mistakes(_mistake(m) for m in mistakes)
    except ValidationError as err:
        raise ConfigError(f"SkillRL bank: {err.errors()[0]['msg']}") from None


def to_skillrl(bank: Bank) -> dict[str, Any]:
    """SkillRL's bank JSON of a skillstate bank (`metadata.source` says where it came from)."""

    def row(skill: BankSkill) -> dict[str, str]:
        return {"skill_id": skill.id, "title": skill.title, "principle": skill.principle,
                "when_to_apply": skill.when_to_apply}

    mistakes = []
    for i, mistake in enumerate(bank.mistakes, 1):  # SkillRL's have no category: skillstate's goes in a key of its own
        description, _, avoid = mistake.text.partition(_AVOID)
        entry = {"mistake_id": f"err_{i:03d}", "description": description, "why_it_happens": "",
                 "how_to_avoid": avoid}
        mistakes.append(entry if mistake.category is None else {**entry, "category": mistake.category})
    categories = dict.fromkeys(s.category for s in bank.skills if s.category is not None)  # in bank order
    return {"general_skills": [row(s) for s in bank.general()],
            "task_specific_skills": {c: [row(s) for s in bank.for_category(c)] for c in categories},
            "common_mistakes": mistakes, "metadata": {"source": "skillstate"}}


def bank_from_text(text: str) -> Bank:
    """The bank a bank file holds: SkillRL's layout converted, else skillstate's own (`read_bank`)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        data = None
    return from_skillrl(data) if is_skillrl_bank(data) else read_bank(text)


def mode_for_skill_file(text: str, path: str, explicit: str | None) -> str:
    """The mode a skill file is scored in: bank for a bank file (skillstate's or SkillRL's JSON), else
    skill. `ConfigError` in one line when an explicitly chosen mode contradicts the file."""
    bank = is_bank_text(text)
    if explicit == "skill" and bank:
        raise ConfigError(f"{path} is a skill bank (JSON), but mode skill was chosen: drop mode=skill, or "
                          "give a markdown skill")
    if explicit == "bank" and not bank:
        raise ConfigError(f"mode bank was chosen, but {path} is not a skill bank (skillstate's or SkillRL's bank "
                          "JSON): drop mode=bank to score it as a skill document")
    return "bank" if bank else "skill"
