"""Small deterministic helpers shared by the whole package."""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace: the hashed form."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def hash_value(value: Any) -> str:
    return sha256_text(canonical_json(value))


def derive_seed(*parts: Any) -> int:
    """A seed that depends only on `parts` (never on PYTHONHASHSEED)."""
    digest = hashlib.sha256(canonical_json([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def seeded_rng(*parts: Any) -> random.Random:
    return random.Random(derive_seed(*parts))


def unit_float(*parts: Any) -> float:
    """A deterministic number in [0, 1) derived from `parts`."""
    return derive_seed(*parts) / 2**64


_STEP_RE = re.compile(r"^(?:step_?)?(\d+)$", re.IGNORECASE)


def parse_step(value: str | int) -> int:
    """Accept `5`, `"5"`, `"step_5"` and `"step5"`."""
    from skillstate.errors import UserError

    if isinstance(value, int):
        step = value
    else:
        match = _STEP_RE.match(str(value).strip())
        if not match:
            raise UserError(f"not a step: {value!r} (use a number like 5 or step_5)")
        step = int(match.group(1))
    if step < 0:
        raise UserError(f"not a step: {value!r} (steps are 0 or more)")
    return step


def chunked(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]
