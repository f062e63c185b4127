"""The bank as a run's skill: in mode bank the blob a run holds where a
SkillOpt run holds its skill document is the bank's canonical JSON, so the
log's current and best skill, the score cache, replay, fork and audit cover
the bank unchanged. Each rollout sees only the skills retrieved for its task,
rendered as its system prompt."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from skillstate.bank.embedding import Embedder, skill_text, task_text
from skillstate.bank.export import render_skills
from skillstate.bank.retrieval import retrieve_embedding, retrieve_template
from skillstate.bank.skills import Bank
from skillstate.config import BankConfig
from skillstate.errors import ConfigError
from skillstate.log.values import RetrievedSkill
from skillstate.util import canonical_json

EMPTY_BANK = Bank()


def bank_text(bank: Bank) -> str:
    return canonical_json(bank.model_dump(mode="json"))


@lru_cache(maxsize=16)
def read_bank(text: str) -> Bank:
    """The bank a blob holds (a bank file given as the initial skill is checked with this too)."""
    try:
        return Bank.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise ConfigError(f"not a skill bank (mode bank wants a bank JSON file): {where}: {first['msg']}") from None


def category_of(item: dict[str, Any]) -> str | None:
    """A task's category: its `category`, else its `task_type`."""
    value = item.get("category") or item.get("task_type")
    return str(value) if value else None


def task_description(item: dict[str, Any]) -> str:
    return str(item.get("question") or item.get("task") or item.get("goal") or item.get("id"))


def retrieve(bank: Bank, item: dict[str, Any], config: BankConfig, embedder: Embedder) -> list[RetrievedSkill]:
    category = category_of(item)
    if config.retrieval == "template":
        chosen = retrieve_template(bank, category, config.general_k)
    else:
        candidates = [*bank.for_category(category), *bank.general()]
        vectors = dict(zip([s.id for s in candidates], embedder.embed([skill_text(s) for s in candidates]),
                           strict=True))
        query = task_text(task_description(item), category if config.query_category else None)
        (task_vector,) = embedder.embed([query])
        chosen = retrieve_embedding(bank, category, task_vector, vectors, config.top_k, config.similarity_threshold,
                                    config.min_retrieved)
    return [RetrievedSkill(skill_id=r.skill_id, similarity=r.similarity) for r in chosen]


def prompt_for(bank_json: str, item: dict[str, Any], config: BankConfig,
               embedder: Embedder) -> tuple[str, list[RetrievedSkill]]:
    """The system prompt one task gets from the bank, and the skills in it."""
    bank = read_bank(bank_json)
    chosen = retrieve(bank, item, config, embedder)
    skills = [s for r in chosen if (s := bank.by_id(r.skill_id)) is not None]
    return render_skills(skills, [m.text for m in bank.mistakes_for(category_of(item), config.mistakes_k)]), chosen
