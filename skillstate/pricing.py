"""What LLM calls cost: a price table in USD per million tokens, and the
budget that stops a run once the requests it sent cost `max_cost_usd`.

Prices are list prices of common hosted models (input, output) as published
by their providers; a run's `prices` config key adds models or overrides
these. A dated snapshot (`gpt-4o-2024-08-06`) takes the price of its base
name. A model the table does not know costs 0 and draws one warning; a zero
price (`prices: {MODEL: [0, 0]}`) says that a local model is free and draws
none. The sim models carry nominal prices (those of gpt-4o-mini for the target,
and gpt-4.1 for the optimizer and the judge) so that a sim run shows what a comparable real
run costs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import cast

from skillstate.errors import SkillstateError

Price = tuple[float, float]  # USD per 1M input tokens, per 1M output tokens

DEFAULT_PRICES: dict[str, Price] = {
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-3.5-turbo": (0.50, 1.50),
    "o1": (15.00, 60.00),
    "o3": (2.00, 8.00),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
    # embeddings (mode bank, bank.embedder: openai): input tokens only
    "text-embedding-3-small": (0.02, 0.0),
    "text-embedding-3-large": (0.13, 0.0),
    "text-embedding-ada-002": (0.10, 0.0),
    "all-MiniLM-L6-v2": (0.0, 0.0),  # bank.embedder local: on this machine
    # nominal prices of the simulated models (see the module docstring)
    "sim-target": (0.15, 0.60),
    "sim-optimizer": (2.00, 8.00),
    "sim-judge": (2.00, 8.00),
}


def price_for(model: str, extra: Mapping[str, Price] | None = None) -> Price | None:
    """The price of `model`: exact name first, then the longest table name
    it extends with a dash (a dated snapshot); None when unknown."""
    # cast: `extra` holds prices; tuple() only turns one read from JSON (a list) back into a tuple
    table = {**DEFAULT_PRICES, **{k: cast(Price, tuple(v)) for k, v in (extra or {}).items()}}
    if model in table:
        return table[model]
    bases = [name for name in table if model.startswith(name + "-")]
    return table[max(bases, key=len)] if bases else None


def cost_usd(prompt_tokens: int, completion_tokens: int, price: Price | None) -> float:
    if price is None:
        return 0.0
    return (prompt_tokens * price[0] + completion_tokens * price[1]) / 1_000_000


def sent_cost(rows, prices: Mapping[str, Price] | None = None) -> dict[str, float]:
    """USD per role of the requests a run sent, from `Store.paid_by_model` rows."""
    out: dict[str, float] = {}
    for role, model, _calls, pt, ct in rows:
        out[role] = out.get(role, 0.0) + cost_usd(pt, ct, price_for(model, prices))
    return out


class BudgetExhausted(SkillstateError):
    """The run's requests reached `max_cost_usd`; it stopped at an event boundary."""

    def __init__(self, spent: float, limit: float):
        super().__init__(f"cost budget reached: ${spent:.4f} spent of max_cost_usd ${limit:.4f}")
        self.spent, self.limit = spent, limit


class Budget:
    """Spend of one run, shared by its recording clients across threads.

    `spent` starts at what the run's earlier invocations sent (from the call
    table); each new request is checked before it is sent and added after."""

    def __init__(self, limit: float | None, spent: float, prices: Mapping[str, Price] | None = None):
        self.limit = limit
        self.spent = spent
        self.prices = dict(prices or {})
        self._lock = threading.Lock()

    def check(self) -> None:
        with self._lock:
            if self.limit is not None and self.spent >= self.limit:
                raise BudgetExhausted(self.spent, self.limit)

    def add(self, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        cost = cost_usd(prompt_tokens, completion_tokens, price_for(model, self.prices))
        with self._lock:
            self.spent += cost
