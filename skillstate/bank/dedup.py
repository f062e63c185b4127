"""Keep near-duplicate skills out of the bank.

`dedupe` walks the proposed skills in order against the bank as it would be
after adding the ones accepted so far (`Bank.with_skills` semantics). A skill
is dropped when
- `empty`: its title (after normalization) or its principle is blank;
- `id_taken`: its id is already used by a skill it does not refine;
- `title_match`: its normalized title equals that of a skill in an
  overlapping scope (either skill general, or both task skills of the same
  category);
- `similar`: its cosine similarity to any skill of the bank, whatever the
  scope, is above `threshold`.
The skill a proposal refines is exempt from the last three checks, since the
proposal replaces it. So no accepted skill has similarity above `threshold` to
any other skill of `bank.with_skills(result.added)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from skillstate.bank.embedding import cosine, skill_text
from skillstate.bank.skills import Bank, BankSkill, normalize_text

DEFAULT_DEDUP_THRESHOLD = 0.85

EmbedFn = Callable[[list[str]], list[list[float]]]
DropReason = Literal["title_match", "similar", "empty", "id_taken", "over_budget", "unknown_category"]


class DroppedSkill(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    skill: BankSkill
    reason: DropReason
    similar_to: str | None = None
    similarity: float | None = None


class DedupResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    added: list[BankSkill]
    dropped: list[DroppedSkill]


@dataclass(frozen=True)
class _Entry:
    skill: BankSkill
    title: str
    vector: list[float]


def _overlap(a: BankSkill, b: BankSkill) -> bool:
    return a.tier == "general" or b.tier == "general" or a.category == b.category


def _vectors(texts: list[str], embed: EmbedFn) -> dict[str, list[float]]:
    unique = list(dict.fromkeys(texts))
    if not unique:
        return {}
    vectors = embed(unique)
    if len(vectors) != len(unique):
        raise ValueError(f"the embedder returned {len(vectors)} vectors for {len(unique)} texts")
    return dict(zip(unique, vectors, strict=True))


def dedupe(
    bank: Bank,
    proposed: list[BankSkill],
    embed: EmbedFn,
    threshold: float = DEFAULT_DEDUP_THRESHOLD,
) -> DedupResult:
    """Split `proposed` into the skills to add and the ones to drop (see the
    module docstring). Each distinct text is embedded once, in one call."""
    live = [p for p in proposed if normalize_text(p.title) and p.principle.strip()]
    vectors = _vectors([skill_text(s) for s in (*bank.skills, *live)], embed)
    current = [_Entry(s, normalize_text(s.title), vectors[skill_text(s)]) for s in bank.skills]
    added: list[BankSkill] = []
    dropped: list[DroppedSkill] = []
    for skill in proposed:
        if not normalize_text(skill.title) or not skill.principle.strip():
            dropped.append(DroppedSkill(skill=skill, reason="empty"))
            continue
        target = skill.provenance.refines
        others = [e for e in current if e.skill.id != target]
        drop = _check(skill, normalize_text(skill.title), vectors[skill_text(skill)], others, threshold)
        if drop is not None:
            dropped.append(drop)
            continue
        entry = _Entry(skill, normalize_text(skill.title), vectors[skill_text(skill)])
        index = next((i for i, e in enumerate(current) if e.skill.id == target), None)
        if index is None:
            current.append(entry)
        else:
            current[index] = entry
        added.append(skill)
    return DedupResult(added=added, dropped=dropped)


def _check(
    skill: BankSkill, title: str, vector: list[float], others: list[_Entry], threshold: float
) -> DroppedSkill | None:
    for e in others:
        if e.skill.id == skill.id:
            return DroppedSkill(skill=skill, reason="id_taken", similar_to=e.skill.id)
    for e in others:
        if e.title == title and _overlap(skill, e.skill):
            return DroppedSkill(skill=skill, reason="title_match", similar_to=e.skill.id)
    best: tuple[float, str] | None = None
    for e in others:
        sim = cosine(vector, e.vector)
        if sim > threshold and (best is None or sim > best[0]):
            best = (sim, e.skill.id)
    if best is None:
        return None
    return DroppedSkill(skill=skill, reason="similar", similar_to=best[1], similarity=best[0])
