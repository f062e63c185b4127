"""Embeddings: the interface, cosine similarity and an offline sim embedder.

`SimEmbedder` is a signed feature-hashing embedder: each normalized word
unigram and adjacent-word bigram (a few English function words dropped) adds
+1 or -1 to one of `dim` buckets, both chosen by a BLAKE2b hash of the
feature (never Python's salted `hash`), and the vector is L2-normalized. Texts
that share words are similar, identical texts have cosine 1, and the result
is the same on every machine and Python version.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from skillstate.bank.skills import BankSkill

_WORD = re.compile(r"[^\W_]+")

STOPWORDS = frozenset("a an and are as at be by for from in is it its of on or that the this to was were with".split())


class Embedder(Protocol):
    """Turns texts into vectors; `model` names the model (part of the key
    embeddings are stored under)."""

    @property
    def model(self) -> str: ...

    def embed(self, texts: list[str]) -> list[list[float]]: ...


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity in [-1, 1]: 0.0 when either vector is zero or holds
    a non-finite value, never NaN. Raises ValueError on a length mismatch."""
    if len(a) != len(b):
        raise ValueError(f"vectors differ in length: {len(a)} and {len(b)}")
    scale_a = max((abs(x) for x in a), default=0.0)
    scale_b = max((abs(y) for y in b), default=0.0)
    if scale_a == 0.0 or scale_b == 0.0 or not (math.isfinite(scale_a) and math.isfinite(scale_b)):
        return 0.0
    # Scaled first, so that squaring large components cannot overflow.
    xs = [x / scale_a for x in a]
    ys = [y / scale_b for y in b]
    norm = math.sqrt(math.fsum(x * x for x in xs)) * math.sqrt(math.fsum(y * y for y in ys))
    value = math.fsum(x * y for x, y in zip(xs, ys, strict=True)) / norm
    if not math.isfinite(value):
        return 0.0
    return max(-1.0, min(1.0, value))


def words(text: str) -> list[str]:
    """The normalized words of `text`: NFKC, casefolded, letters and digits."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [w for w in _WORD.findall(folded) if w not in STOPWORDS]


def _bucket(feature: str, dim: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    number = int.from_bytes(digest, "big")
    return number % dim, (1.0 if (number >> 63) & 1 else -1.0)


class SimEmbedder:
    """Deterministic, offline, dependency-free embeddings for tests and the
    sim world (see the module docstring)."""

    def __init__(self, dim: int = 256):
        if dim < 1:
            raise ValueError("dim must be at least 1")
        self.dim = dim

    @property
    def model(self) -> str:
        return f"sim-hash-{self.dim}"

    def embed_one(self, text: str) -> list[float]:
        tokens = words(text)
        features = tokens + [f"{x} {y}" for x, y in zip(tokens, tokens[1:], strict=False)]
        vector = [0.0] * self.dim
        for feature in features:
            index, sign = _bucket(feature, self.dim)
            vector[index] += sign
        norm = math.sqrt(math.fsum(v * v for v in vector))
        return [v / norm for v in vector] if norm > 0.0 else vector

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_one(text) for text in texts]


def skill_text(skill: BankSkill) -> str:
    """The text embedded for a skill: title, principle and, when given,
    when_to_apply, one per line."""
    parts = [skill.title.strip(), skill.principle.strip(), skill.when_to_apply.strip()]
    return "\n".join(p for p in parts if p)


def task_text(description: str, category: str | None = None) -> str:
    """The text embedded for a task: its description with whitespace runs
    collapsed, after its category (underscores as spaces) when one is given.
    Retrieval filters by category too, but a description that never names
    its kind of task (`What is 20 + 9 × 4?`) is otherwise far from every
    skill for that kind."""
    text = " ".join(description.split())
    if category and category.strip():
        return f"{' '.join(category.replace('_', ' ').split())}: {text}"
    return text
