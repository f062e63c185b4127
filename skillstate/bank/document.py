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
from skillstate.bank.skills import Bank, BankSkill
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


def _candidates(bank: Bank, item: dict[str, Any]) -> list[BankSkill]:
    """The skills embedding retrieval compares with `item`: its category's and the general ones."""
    category = category_of(item)
    return [*bank.for_category(category), *bank.general()]


def _query(item: dict[str, Any], config: BankConfig) -> str:
    return task_text(task_description(item), category_of(item) if config.query_category else None)


def retrieval_texts(bank_json: str, items: list[dict[str, Any]], config: BankConfig) -> list[str]:
    """Every text the retrieval of `items` from the bank embeds (each
    candidate skill's and each task's query), each once; none under
    template retrieval."""
    if config.retrieval == "template":
        return []
    bank = read_bank(bank_json)
    texts: dict[str, None] = {}
    for item in items:
        texts.update(dict.fromkeys(skill_text(s) for s in _candidates(bank, item)))
        texts[_query(item, config)] = None
    return list(texts)


def retrieve(bank: Bank, item: dict[str, Any], config: BankConfig, embedder: Embedder) -> list[RetrievedSkill]:
    category = category_of(item)
    if config.retrieval == "template":
        chosen = retrieve_template(bank, category, config.general_k)
    else:
        candidates = _candidates(bank, item)
        vectors = dict(zip([s.id for s in candidates], embedder.embed([skill_text(s) for s in candidates]),
                           strict=True))
        (task_vector,) = embedder.embed([_query(item, config)])
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
