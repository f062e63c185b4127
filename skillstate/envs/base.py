"""The environment interface.

An environment holds the splits of a dataset and runs the target on one
item. To bring your own, subclass `SkillEnv` (or `QAEnv` to keep its data
format and scoring), then name it in the config: `env:
"python:my_pkg.my_module:MyEnv"`, or register it under the entry point group
`skillstate.envs` of an installed package and use that name. Its own settings
go in the config's `env_config` section, validated by `config_model`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from numbers import Real
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from skillstate.errors import EnvFailure
from skillstate.llm.base import CallResult
from skillstate.util import sha256_text


class Complete(Protocol):
    """One target call through the run's journal: the messages, and the
    JSON-schema functions the target may call (a tool-using environment)."""

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult: ...


# One judge call through the run's journal, for an environment that grades with one (`uses_judge`): the
# messages and the sample's seed -> its result.
JudgeCall = Callable[[list[dict[str, Any]], "int | None"], CallResult]


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
    skills_loaded: list[str] = field(default_factory=list)  # disclosure tools: the skills the target loaded
    files_read: list[str] = field(default_factory=list)  # and the files it read ("skill/path")
    blobs: dict[str, str] = field(default_factory=dict)  # what the trajectory names by hash (hash -> text), stored


def score_problem(value: Any) -> str | None:
    """Why `value` is not a score (a finite number in [0, 1]); None when it is one."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return f"is {_shown(value)} ({type(value).__name__}), not a number"
    number = float(value)
    if not math.isfinite(number):
        return f"is {number!r}, not a finite number"
    if not 0.0 <= number <= 1.0:
        return f"is {number!r}, outside [0, 1]"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def check_outcome(outcome: Any, env_name: str, item_id: str) -> RolloutOutcome:
    """What an environment's `rollout` returned, checked at the boundary
    before anything of it is stored: a RolloutOutcome whose `hard` and `soft`
    are finite numbers in [0, 1] (returned as floats), whose other fields
    have their documented types, and whose conversation and trajectory hold
    only what JSON can (no NaN). Anything else is an EnvFailure naming the
    environment, the item and the field (the run stops, resumable once the
    environment is fixed; nothing of the rollout is written)."""

    def refuse(field_name: str, problem: str) -> EnvFailure:
        return EnvFailure(f"env {env_name!r} returned a bad rollout for item {item_id!r}: {field_name} {problem}")

    if not isinstance(outcome, RolloutOutcome):
        raise refuse("the outcome", f"is {type(outcome).__name__}, not a RolloutOutcome")
    for name in ("hard", "soft"):
        problem = score_problem(getattr(outcome, name))
        if problem:
            raise refuse(name, problem)
    for name in ("fail_reason", "prediction", "task_type"):
        value = getattr(outcome, name)
        if not isinstance(value, str):
            raise refuse(name, f"is {type(value).__name__}, not a str")
    for name, ok in (("turns", isinstance(outcome.turns, int) and not isinstance(outcome.turns, bool)
                      and outcome.turns >= 0),
                     ("seed", outcome.seed is None or (isinstance(outcome.seed, int)
                                                       and not isinstance(outcome.seed, bool))),
                     ("call", outcome.call is None or isinstance(outcome.call, CallResult)),
                     ("calls", isinstance(outcome.calls, list) and all(isinstance(c, CallResult)
                                                                        for c in outcome.calls)),
                     ("messages", isinstance(outcome.messages, list) and all(isinstance(m, dict)
                                                                              for m in outcome.messages)),
                     ("skills_loaded", isinstance(outcome.skills_loaded, list)
                      and all(isinstance(x, str) for x in outcome.skills_loaded)),
                     ("files_read", isinstance(outcome.files_read, list)
                      and all(isinstance(x, str) for x in outcome.files_read)),
                     ("trajectory", outcome.trajectory is None or isinstance(outcome.trajectory, dict)),
                     ("blobs", isinstance(outcome.blobs, dict) and all(
                         isinstance(t, str) and k == sha256_text(t) for k, t in outcome.blobs.items()))):
        if not ok:
            raise refuse(name, f"has the wrong type ({_shown(getattr(outcome, name))})")
    from skillstate.log.event_codec import unfit_for_json

    for name in ("messages", "trajectory"):
        found = unfit_for_json(getattr(outcome, name), name)
        if found is not None:
            raise refuse(found[0], f"is {_shown(found[1])}, which JSON cannot hold")
    return replace(outcome, hard=float(outcome.hard), soft=float(outcome.soft))


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

    @property
    def replays_agent(self) -> bool:
        """Whether verification re-executes a rollout against the journal. An environment whose target's
        requests are not a function of the run (an external agent) says False, and checks recorded rollouts."""
        return True

    def check_recorded(self, item: dict[str, Any], trajectory: Any, result: Any,
                       blob: Callable[[str], str] | None = None) -> str | None:
        """What does not hold in a recorded rollout (verification, when `replays_agent` is False); `blob` reads a
        blob of the log by hash (what the trajectory names)."""
        return "this environment's rollouts are re-executed, not checked from the log"

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

