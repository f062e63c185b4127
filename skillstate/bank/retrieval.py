"""Choose the skills to put in the agent's prompt for one task.

Two modes, as in SkillRL:
- template (the official code's default): every task skill of the task's
  category, then the first `k_general` general skills in bank order. The
  default K of 6 follows the `top_k=6` that public reimplementations of the
  official `SkillsOnlyMemory` retriever use for the general tier.
- embedding (the paper's): the top K skills, over the category's skills and
  the general tier, whose cosine similarity to the task is above a threshold
  (K = 6, threshold 0.4). A threshold suits one embedder and not another
  (the offline sim embedder's related texts rarely pass 0.4, nor do many of
  all-MiniLM-L6-v2's), so a floor `min_k` gives every task its `min_k` most
  similar candidates even below it; `min_k` 0 is the paper's rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from skillstate.bank.embedding import cosine
from skillstate.bank.skills import Bank

DEFAULT_K_GENERAL = 6
DEFAULT_K = 6
DEFAULT_RETRIEVAL_THRESHOLD = 0.4


class Retrieved(BaseModel):
    """One chosen skill; `similarity` is None in template mode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    skill_id: str
    similarity: float | None = None


def retrieve_template(bank: Bank, category: str | None, k_general: int = DEFAULT_K_GENERAL) -> list[Retrieved]:
    """The category's skills, then the first `k_general` general ones."""
    chosen = [*bank.for_category(category), *bank.general()[: max(0, k_general)]]
    return [Retrieved(skill_id=s.id) for s in chosen]


def retrieve_embedding(
    bank: Bank,
    category: str | None,
    task_vector: Sequence[float],
    skill_vectors: Mapping[str, Sequence[float]],
    k: int = DEFAULT_K,
    threshold: float = DEFAULT_RETRIEVAL_THRESHOLD,
    min_k: int = 0,
) -> list[Retrieved]:
    """At most `k` of the category's and the general skills, most similar
    first (ties by id): those whose similarity to the task is strictly above
    `threshold`, and at least the `min(min_k, k)` most similar whatever
    their similarity. Raises KeyError naming a candidate skill with no
    vector."""
    scored: list[tuple[float, str]] = []
    for skill in (*bank.for_category(category), *bank.general()):
        if skill.id not in skill_vectors:
            raise KeyError(f"no embedding for skill {skill.id}")
        scored.append((cosine(task_vector, skill_vectors[skill.id]), skill.id))
    scored.sort(key=lambda pair: (-pair[0], pair[1]))
    floor = min(max(0, min_k), max(0, k))
    chosen = [pair for i, pair in enumerate(scored[: max(0, k)]) if i < floor or pair[0] > threshold]
    return [Retrieved(skill_id=sid, similarity=sim) for sim, sid in chosen]
