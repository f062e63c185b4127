"""The trajectory JSON format of the spec, and its loader.

One record: `{id, task_description, task_category, steps: [{observation,
action, reward, step_index}], total_reward, success, metadata}`. A step's
`reward` defaults to 0 and `metadata` to `{}`; every other field is required,
and unknown fields are refused (they are usually typos; free-form data goes in
`metadata`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skillstate.errors import DataError


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TrajectoryStep(_Record):
    observation: str
    action: str
    reward: float = 0.0
    step_index: int


class Trajectory(_Record):
    id: str = Field(min_length=1)
    task_description: str
    task_category: str
    steps: list[TrajectoryStep]
    total_reward: float
    success: bool
    metadata: dict[str, Any] = Field(default_factory=dict)

    def ordered_steps(self) -> list[TrajectoryStep]:
        """The steps by `step_index` (stable for equal indices)."""
        return sorted(self.steps, key=lambda s: s.step_index)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _records(text: str) -> list[tuple[str, Any]]:
    """(where, value) pairs: a JSON list, one JSON object, or JSON lines."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    else:
        if isinstance(whole, list):
            return [(f"record {i}", value) for i, value in enumerate(whole, 1)]
        return [("record 1", whole)]
    out: list[tuple[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"record {len(out) + 1} (line {number})"
        try:
            out.append((where, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(f"trajectories: {where}: not valid JSON: {exc.msg} at column {exc.colno}") from None
    return out


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    more = error.error_count() - 1
    suffix = f" (and {more} more)" if more else ""
    return f"{location or 'record'}: {first['msg']}{suffix}"


def load_trajectories(text: str) -> list[Trajectory]:
    """Parse trajectories from a JSON list, a single JSON object or JSON
    lines. Blank text gives []. Raises `DataError` (a `UserError`) with one
    line naming the first bad record, its id when it has one, and the field."""
    if not text.strip():
        return []
    trajectories: list[Trajectory] = []
    seen: set[str] = set()
    for where, value in _records(text):
        if not isinstance(value, dict):
            raise DataError(f"trajectories: {where}: expected a JSON object, got {type(value).__name__}")
        label = where if not isinstance(value.get("id"), str) else f"{where} (id {_one_line(value['id'], 60)!r})"
        try:
            trajectory = Trajectory.model_validate(value)
        except ValidationError as exc:
            raise DataError(_one_line(f"trajectories: {label}: {_describe(exc)}")) from None
        if trajectory.id in seen:
            raise DataError(_one_line(f"trajectories: {label}: duplicate id"))
        seen.add(trajectory.id)
        trajectories.append(trajectory)
    return trajectories
