"""ETO's ALFWorld trajectories (the SFT data of ETO and the projects that
reuse it), converted to the trajectory format of `bank.trajectories`.

An ETO file is a JSON list of `{id, conversations: [{from: human|gpt,
value}], ...}`, optionally with `reward` or `success`. The conversation opens
with instructions (and often an example); the episode starts at the first
human turn that holds "Your task is to:". From there each human turn is an
observation and the gpt turn after it the action (its `Action:` line when it
has one). The category is ALFWorld's task type, read from the id when it
names one, else guessed from the task's wording. A record with neither
`success` nor `reward` counts as a success (ETO's SFT trajectories are
expert demonstrations).
"""

from __future__ import annotations

import json
from typing import Any

from skillstate.bank.trajectories import Trajectory, TrajectoryStep, load_trajectories
from skillstate.errors import DataError

TASK_MARK = "Your task is to:"
TASK_TYPES = ("pick_clean_then_place_in_recep", "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
              "pick_two_obj_and_place", "look_at_obj_in_light", "pick_and_place_simple")
_WORDING = (("clean", "pick_clean_then_place_in_recep"), ("hot", "pick_heat_then_place_in_recep"),
            ("heat", "pick_heat_then_place_in_recep"), ("cool", "pick_cool_then_place_in_recep"),
            ("two ", "pick_two_obj_and_place"), ("desklamp", "look_at_obj_in_light"),
            ("look at", "look_at_obj_in_light"), ("examine", "look_at_obj_in_light"))


def is_eto(data: Any) -> bool:
    """Whether parsed JSON is a list of ETO conversation records."""
    return (isinstance(data, list) and bool(data) and isinstance(data[0], dict)
            and isinstance(data[0].get("conversations"), list))


def category(record_id: str, task: str) -> str:
    named = next((t for t in TASK_TYPES if t in record_id), None)
    if named:
        return named
    low = task.casefold()
    return next((t for word, t in _WORDING if word in low), "pick_and_place_simple")


def _action(reply: str) -> str:
    for line in reversed(reply.strip().splitlines()):
        if line.strip().casefold().startswith("action:"):
            return line.split(":", 1)[1].strip()
    return reply.strip()


def from_eto(record: dict[str, Any], where: str) -> Trajectory:
    turns = record.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) and "value" in t for t in turns):
        raise DataError(f"ETO trajectories: {where}: conversations must be a list of {{from, value}} turns")
    start = next((i for i, t in enumerate(turns) if t.get("from") == "human" and TASK_MARK in str(t["value"])), 0)
    first = str(turns[start]["value"]) if turns else ""
    task = first.split(TASK_MARK, 1)[1].strip().splitlines()[0].strip() if TASK_MARK in first else first.strip()
    steps: list[TrajectoryStep] = []
    observation: str | None = None
    for turn in turns[start:]:
        if turn.get("from") == "human":
            observation = str(turn["value"])
        elif turn.get("from") == "gpt" and observation is not None:
            steps.append(TrajectoryStep(observation=observation, action=_action(str(turn["value"])),
                                        step_index=len(steps)))
            observation = None
    reward = record.get("reward")
    success = bool(record["success"]) if "success" in record else (float(reward) > 0 if reward is not None else True)
    record_id = str(record.get("id") or where)
    return Trajectory(id=record_id, task_description=task, task_category=category(record_id, task), steps=steps,
                      total_reward=float(reward) if reward is not None else float(success), success=success,
                      metadata={"source": "eto"})


def trajectories_from_text(text: str) -> list[Trajectory]:
    """The trajectories of a `bank.trajectories` file: ETO's format converted, else the spec's own format."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        data = None
    if not is_eto(data):
        return load_trajectories(text)
    converted = [from_eto(r, f"record {i}") for i, r in enumerate(data, 1) if isinstance(r, dict)]
    return load_trajectories(json.dumps([t.model_dump(mode="json") for t in converted]))  # its checks (unique ids)
