"""A small text world written in plain Python: find an object in a house and take it.

It shows what an episode environment needs (see skillstate.envs.episode):
- `open(item, seed)` starts an episode and returns a Session with the goal
  and the first observation; `Session.step(action)` returns a Turn;
- `builtin_splits` generates the tasks, so no data directory is needed;
- `reference_actions` gives a solving action sequence, which the sim
  backend's agent plays from (and the tests check it solves the task).

Run it:  PYTHONPATH=examples/custom_episode skillstate run --config examples/custom_episode/config.yaml
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from skillstate.envs.episode import EpisodeEnv, Session, Turn

ROOMS = ["kitchen", "hallway", "pantry", "study", "bedroom", "bathroom", "cellar", "attic", "garden"]
OBJECTS = ["coin", "key", "apple", "book", "candle"]
STEP = {"north": (0, -1), "south": (0, 1), "east": (1, 0), "west": (-1, 0)}
BACK = {"north": "south", "south": "north", "east": "west", "west": "east"}


class RoomsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = Field(3, ge=2, le=3, description="The house is size x size rooms.")
    closed_doors: float = Field(0.5, ge=0.0, le=1.0, description="Share of doors that start closed.")
    items_per_split: dict[str, int] = Field(default_factory=lambda: {"train": 30, "val": 15, "test": 15})


class House:
    """The layout of one task: rooms on a grid, doors between neighbours, one object."""

    def __init__(self, seed: int, size: int, closed_share: float):
        rng = random.Random(seed)
        cells = [(x, y) for y in range(size) for x in range(size)]
        names = rng.sample(ROOMS, len(cells))
        self.name = dict(zip(cells, names, strict=True))
        self.closed = {frozenset((a, b)) for a in cells for d, (dx, dy) in STEP.items()
                       if (b := (a[0] + dx, a[1] + dy)) in self.name and d in ("east", "south")
                       and rng.random() < closed_share}
        self.start = rng.choice(cells)
        self.goal_cell = rng.choice([c for c in cells if c != self.start])
        self.obj = rng.choice(OBJECTS)

    def exits(self, cell: tuple[int, int]) -> dict[str, tuple[int, int]]:
        return {d: (cell[0] + dx, cell[1] + dy) for d, (dx, dy) in STEP.items()
                if (cell[0] + dx, cell[1] + dy) in self.name}


class RoomsSession(Session):
    def __init__(self, house: House, seed: int):
        self.house, self.seed = house, seed
        self.cell, self.closed, self.held = house.start, set(house.closed), False
        self.goal = f"Find the {house.obj} somewhere in the house and take it."
        self.observation = self.describe()

    def describe(self) -> str:
        h = self.house
        parts = [f"You are in the {h.name[self.cell]}."]
        if self.cell == h.goal_cell and not self.held:
            parts.append(f"There is a {h.obj} here.")
        for d, other in sorted(self.house.exits(self.cell).items()):
            state = "a closed door" if frozenset((self.cell, other)) in self.closed else "an open doorway"
            parts.append(f"To the {d} is {state}.")
        return " ".join(parts)

    def step(self, action: str) -> Turn:
        a = " ".join(action.lower().split())
        exits = self.house.exits(self.cell)
        if a in ("look around", "look"):
            return Turn(action, self.describe())
        if a == "inventory":
            return Turn(action, f"You carry: {self.house.obj if self.held else 'nothing'}.")
        if a.startswith("open door to ") and a[13:] in exits:
            door = frozenset((self.cell, exits[a[13:]]))
            if door not in self.closed:
                return Turn(action, "That door is already open.", invalid=True)
            self.closed.discard(door)
            return Turn(action, f"You open the door to the {a[13:]}.")
        if a.startswith("move ") and a[5:] in exits:
            other = exits[a[5:]]
            if frozenset((self.cell, other)) in self.closed:
                return Turn(action, "The door is closed.", invalid=True)
            self.cell = other
            return Turn(action, self.describe())
        if a == f"take {self.house.obj}" and self.cell == self.house.goal_cell and not self.held:
            self.held = True
            return Turn(action, f"You take the {self.house.obj}.", reward=1.0, score=1.0, done=True, success=True)
        return Turn(action, "Nothing happens: that is not something you can do here.", invalid=True)


def solve(house: House) -> list[str]:
    """The shortest sequence of actions that takes the object."""
    queue, seen = deque([(house.start, ["look around"])]), {house.start}
    while queue:
        cell, path = queue.popleft()
        if cell == house.goal_cell:
            return path + [f"take {house.obj}"]
        for d, other in sorted(house.exits(cell).items()):
            if other in seen:
                continue
            seen.add(other)
            opening = [f"open door to {d}"] if frozenset((cell, other)) in house.closed else []
            queue.append((other, path + opening + [f"move {d}"]))
    raise AssertionError("every room is reachable")


class RoomsEnv(EpisodeEnv):
    config_model = RoomsConfig

    @classmethod
    def builtin_splits(cls, config: BaseModel, splits: list[str]) -> dict[str, list[dict[str, Any]]]:
        assert isinstance(config, RoomsConfig)
        out, seed = {}, 0
        for name, default in zip(splits, ("train", "val", "test"), strict=False):
            out[name] = []
            for _ in range(config.items_per_split.get(name, config.items_per_split.get(default, 10))):
                seed += 1
                out[name].append({"id": f"house-{seed}", "task_type": "find_object", "seed": seed})
        return out

    def _house(self, item: dict[str, Any]) -> House:
        cfg = self.config
        assert isinstance(cfg, RoomsConfig)
        return House(item["seed"], cfg.size, cfg.closed_doors)

    def open(self, item: dict[str, Any], seed: int) -> RoomsSession:
        return RoomsSession(self._house(item), item["seed"])  # the item's own seed fixes the house

    def reference_actions(self, item: dict[str, Any]) -> tuple[str, str, list[str]]:
        session = RoomsSession(self._house(item), item["seed"])
        return session.goal, session.observation, solve(session.house)

    def default_skill(self) -> str:
        # a deliberately poor start, for the optimizer to improve
        return ("# House explorer\n\nYou move through a house to find things.\n\n- Be quick.\n"
                "- To save time, never look around; act on what you remember.\n")
