"""Skills and the bank that holds them.

Skill ids are content hashes: `skill_id(title, principle, category)` is
`sk_` plus the first 12 hex digits of the SHA-256 of the normalized title,
principle and scope. The same proposal gets the same id in every run, fork or
replay, whatever order skills arrive in, and ids never depend on the bank's
size. A refined skill has new content, hence a new id, and names the skill it
replaces in `provenance.refines`. Imported skills may keep their own ids.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from skillstate.util import sha256_text

Tier = Literal["general", "task"]
Origin = Literal["distill", "evolve", "import"]

MAX_MISTAKES = 12

_NON_WORD = re.compile(r"[\W_]+")


def normalize_text(text: str) -> str:
    """Casefolded, NFKC, punctuation and runs of whitespace as one space."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _NON_WORD.sub(" ", folded).strip()


def skill_id(title: str, principle: str, category: str | None = None) -> str:
    """The content id of a skill: stable across runs and insertion orders."""
    scope = "general" if category is None else f"task:{category}"
    key = "\n".join([scope, normalize_text(title), normalize_text(principle)])
    return "sk_" + sha256_text(key)[:12]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class SkillProvenance(_Frozen):
    """Where a skill came from: the trajectories (item ids) the teacher read,
    the phase, the step of the event that added it, and the skill it refines."""

    trajectories: list[str] = Field(default_factory=list)
    origin: Origin
    step: int = 0
    refines: str | None = None


class BankSkill(_Frozen):
    id: str = Field(min_length=1)
    title: str
    principle: str
    when_to_apply: str = ""
    tier: Tier
    category: str | None = None
    provenance: SkillProvenance

    @model_validator(mode="after")
    def _tier_matches_category(self) -> BankSkill:
        if self.tier == "task" and not (self.category or "").strip():
            raise ValueError("a task-tier skill needs a category")
        if self.tier == "general" and self.category is not None:
            raise ValueError("a general skill has no category")
        return self

    @classmethod
    def make(
        cls,
        title: str,
        principle: str,
        *,
        provenance: SkillProvenance,
        category: str | None = None,
        when_to_apply: str = "",
    ) -> BankSkill:
        """A skill with its content id; the tier follows from `category`."""
        return cls(
            id=skill_id(title, principle, category),
            title=title,
            principle=principle,
            when_to_apply=when_to_apply,
            tier="general" if category is None else "task",
            category=category,
            provenance=provenance,
        )


class Mistake(_Frozen):
    """A common mistake: one line, and the task category it was seen in
    (None: any task's). A general mistake is stored as its bare text, the
    form every mistake had before they had categories, so those banks keep
    their JSON (and their blobs' hashes)."""

    text: str
    category: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_text(cls, data: Any) -> Any:
        """A bare string is a general mistake, kept as written (a bank read back is the bank that was written;
        `of` and `with_mistakes` tidy new ones)."""
        return {"text": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _named_category(self) -> Mistake:
        if self.category is not None and not self.category.strip():
            raise ValueError("a mistake's category is a name or null")
        return self

    @model_serializer(mode="wrap")
    def _as_text_when_general(self, handler: SerializerFunctionWrapHandler) -> Any:
        return self.text if self.category is None else handler(self)

    @classmethod
    def of(cls, raw: str | Mistake) -> Mistake | None:
        """A new mistake, from a line or a Mistake, its whitespace runs collapsed; None when it is blank."""
        text = " ".join((raw.text if isinstance(raw, Mistake) else raw).split())
        if not text:
            return None
        return cls(text=text, category=raw.category if isinstance(raw, Mistake) else None)


def _mistake_key(mistake: Mistake) -> tuple[str, str]:
    return mistake.category or "", " ".join(mistake.text.split()).casefold()


class Bank(_Frozen):
    """The skills in insertion order (retrieval's "first K general" follows
    it) and the common mistakes, oldest first."""

    skills: tuple[BankSkill, ...] = ()
    mistakes: tuple[Mistake, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Bank:
        ids = [s.id for s in self.skills]
        if len(set(ids)) != len(ids):
            raise ValueError("skill ids in a bank must be unique")
        keys = [_mistake_key(m) for m in self.mistakes]
        if len(set(keys)) != len(keys):
            raise ValueError("mistakes in a bank must be unique (case-insensitively, per category)")
        return self

    def mistakes_for(self, category: str | None, k: int) -> tuple[Mistake, ...]:
        """The mistakes a task of `category` is shown: with `k` 0 every one,
        oldest first (as before mistakes had categories); else the `k` most
        recent of its category's and the general ones, most recent first."""
        if k <= 0:
            return self.mistakes
        mine = [m for m in reversed(self.mistakes) if m.category is None or m.category == category]
        return tuple(mine[:k])

    def general(self) -> tuple[BankSkill, ...]:
        return tuple(s for s in self.skills if s.tier == "general")

    def for_category(self, category: str | None) -> tuple[BankSkill, ...]:
        """The task-tier skills of `category` (none for None)."""
        return tuple(s for s in self.skills if s.tier == "task" and s.category == category)

    def categories(self) -> list[str]:
        return sorted({s.category for s in self.skills if s.category is not None})

    def by_id(self, id: str) -> BankSkill | None:
        return next((s for s in self.skills if s.id == id), None)

    def with_skills(self, new: Iterable[BankSkill]) -> Bank:
        """A bank with `new` folded in, one at a time, in order: a skill whose
        `provenance.refines` names a skill of the bank takes that skill's
        place; any other skill is appended. Raises ValueError when a new id is
        already taken by a skill it does not replace (`dedupe` never proposes
        one)."""
        skills = list(self.skills)
        for skill in new:
            target = skill.provenance.refines
            index = next((i for i, s in enumerate(skills) if s.id == target), None)
            if any(s.id == skill.id for i, s in enumerate(skills) if i != index):
                raise ValueError(f"skill id {skill.id} is already in the bank")
            if index is None:
                skills.append(skill)
            else:
                skills[index] = skill
        return Bank(skills=tuple(skills), mistakes=self.mistakes)

    def with_mistakes(self, new: Iterable[str | Mistake], cap: int = MAX_MISTAKES) -> Bank:
        """Append `new` (lines have whitespace runs collapsed; blanks are
        skipped). A mistake already listed in the same category, compared
        case-insensitively, moves to the end as the most recent; then only
        the `cap` most recent of each category (and of the general ones) are
        kept."""
        kept: dict[tuple[str, str], Mistake] = {_mistake_key(m): m for m in self.mistakes}
        for raw in new:
            mistake = Mistake.of(raw)
            if mistake is None:
                continue
            key = _mistake_key(mistake)
            kept.pop(key, None)
            kept[key] = mistake
        ordered = list(kept.values())
        left: dict[str, int] = {}
        recent = []
        for m in reversed(ordered):  # the newest first, so each scope keeps its `cap` most recent
            scope = m.category or ""
            if left.setdefault(scope, cap) > 0:
                left[scope] -= 1
                recent.append(m)
        return Bank(skills=self.skills, mistakes=tuple(reversed(recent)))
