"""The environment interface."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from skillstate.llm.base import CallResult

Complete = Callable[[list[dict[str, str]]], CallResult]


@dataclass(frozen=True)
class RolloutOutcome:
    hard: float
    soft: float
    fail_reason: str
    prediction: str
    messages: list[dict[str, str]] = field(default_factory=list)
    task_type: str = ""
    call: CallResult | None = None


class SkillEnv:
    """Holds the splits of a dataset and runs the target on one item.

    Subclasses implement `rollout`; multi-turn environments call `complete`
    several times and return the whole conversation.
    """

    kind = "base"

    def __init__(self, splits: dict[str, list[dict[str, Any]]]):
        self.splits = splits
        self._by_id = {item["id"]: item for items in splits.values() for item in items}

    def items(self, split: str) -> list[dict[str, Any]]:
        return self.splits[split]

    def item(self, item_id: str) -> dict[str, Any]:
        return self._by_id[item_id]

    def default_skill(self) -> str:
        raise NotImplementedError

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str]) -> RolloutOutcome:
        raise NotImplementedError

    def describe_item(self, item: dict[str, Any]) -> dict[str, Any]:
        """What the optimizer is shown about an item besides the conversation."""
        return {"id": item["id"], "task_type": item.get("task_type", "")}

