"""The environment interface.

An environment holds the splits of a dataset and runs the target on one
item. To bring your own, subclass `SkillEnv` (or `QAEnv` to keep its data
format and scoring), then name it in the config: `env:
"python:my_pkg.my_module:MyEnv"`, or register it under the entry point group
`skillstate.envs` of an installed package and use that name. Its own settings
go in the config's `env_config` section, validated by `config_model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from skillstate.llm.base import CallResult


class Complete(Protocol):
    """One target call through the run's journal: the messages, and the
    JSON-schema functions the target may call (a tool-using environment)."""

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult: ...


@dataclass(frozen=True)
class RolloutOutcome:
    """What one rollout gave. A single-turn environment returns its one call in
    `call` and the conversation in `messages`; a multi-turn one returns every
    call in `calls` and the whole episode in `trajectory` (stored as a blob)."""

    hard: float
    soft: float
    fail_reason: str
    prediction: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    task_type: str = ""
    call: CallResult | None = None
    calls: list[CallResult] = field(default_factory=list)
    trajectory: dict[str, Any] | None = None
    turns: int = 0
    seed: int | None = None


class Item(BaseModel):
    """The least a data item has: an id (more fields are kept as they are)."""

    model_config = ConfigDict(extra="allow")

    id: str
    task_type: str = ""


class NoConfig(BaseModel):
    """The `env_config` of an environment that takes none: it must be empty."""

    model_config = ConfigDict(extra="forbid")


class SkillEnv:
    """Holds the splits of a dataset and runs the target on one item.

    Subclasses implement `default_skill` and `rollout`; multi-turn
    environments call `complete` several times and return the whole
    conversation. Class attributes a subclass may set:
    - `item_model`: the pydantic model every data item is validated with;
    - `config_model`: the pydantic model of its `env_config` section (the
      validated values are stored in the run's log; `self.config` holds them).
    """

    kind = "base"
    item_model: ClassVar[type[BaseModel]] = Item
    config_model: ClassVar[type[BaseModel]] = NoConfig

    def __init__(self, splits: dict[str, list[dict[str, Any]]], config: BaseModel | None = None):
        self.splits = splits
        self.config = config if config is not None else self.config_model()
        self._by_id = {item["id"]: item for items in splits.values() for item in items}

    @classmethod
    def load_splits(cls, path: str | Path, splits: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The splits of a dataset directory: DIR/<split>.jsonl (or .json), each
        item validated with `item_model`."""
        from skillstate.envs.qa import load_dataset_dir

        return load_dataset_dir(path, splits, cls.item_model)

    @classmethod
    def check_requirements(cls) -> None:
        """Raise a one-line ConfigError when something the environment needs
        outside Python's reach is missing (a JVM, a package in an extra).
        Called before a run is created or resumed."""

    @classmethod
    def builtin_splits(cls, config: BaseModel, splits: list[str]) -> dict[str, list[dict[str, Any]]] | None:
        """The environment's own items when the run names no `data` directory
        (a world that generates its tasks, or a bundled dataset), keyed by the
        requested split names; None when it has none."""
        return None

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

    def reflection_view(self, trajectory: Any) -> dict[str, Any]:
        """The part of a stored trajectory blob the analysts see: here the
        conversation without the system prompt (the skill, shown separately)."""
        messages = trajectory if isinstance(trajectory, list) else trajectory.get("messages", [])
        return {"conversation": [m for m in messages if m.get("role") != "system"]}

