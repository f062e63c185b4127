"""ScienceWorld (`pip install scienceworld`, Java on PATH): elementary
science tasks in a simulated house and garden, e.g. find a living thing,
focus on it and move it to a box; boil water; build a circuit.

Items need no data files: each is (task, fold, variation). The run's train,
val and test splits draw from ScienceWorld's train, dev and test variations
of each task. An episode loads the item's variation into a pooled JVM
process (a fresh world; loading reuses the running JVM) and starts with the
observation of `look around`, as ScienceWorld's own `reset` does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skillstate.envs.episode import Turn
from skillstate.envs.textworlds.java import require_java, require_package
from skillstate.envs.textworlds.pool import PooledSession, ProcessPool, Worker
from skillstate.envs.textworlds.pooled import PooledEpisodeEnv
from skillstate.envs.textworlds.twx import DEFAULT_SKILL
from skillstate.errors import ConfigError, DataError

ENV_NAME = "scienceworld"

# task -> (end of the train variations, end of the dev ones, number of variations);
# each fold is a contiguous range (scienceworld 1.2.3: get_variations_train/dev/test).
TASKS: dict[str, tuple[int, int, int]] = {
    "boil": (14, 21, 30),
    "change-the-state-of-matter-of": (14, 21, 30),
    "chemistry-mix": (16, 24, 32),
    "chemistry-mix-paint-secondary-color": (18, 27, 36),
    "chemistry-mix-paint-tertiary-color": (18, 27, 36),
    "find-animal": (150, 225, 300),
    "find-living-thing": (150, 225, 300),
    "find-non-living-thing": (150, 225, 300),
    "find-plant": (150, 225, 300),
    "freeze": (14, 21, 30),
    "grow-fruit": (62, 93, 126),
    "grow-plant": (62, 93, 126),
    "identify-life-stages-1": (6, 9, 14),
    "identify-life-stages-2": (4, 6, 10),
    "inclined-plane-determine-angle": (84, 126, 168),
    "inclined-plane-friction-named-surfaces": (692, 1038, 1386),
    "inclined-plane-friction-unnamed-surfaces": (80, 120, 162),
    "lifespan-longest-lived": (62, 93, 125),
    "lifespan-longest-lived-then-shortest-lived": (62, 93, 125),
    "lifespan-shortest-lived": (62, 93, 125),
    "measure-melting-point-known-substance": (218, 327, 436),
    "measure-melting-point-unknown-substance": (150, 225, 300),
    "melt": (14, 21, 30),
    "mendelian-genetics-known-plant": (60, 90, 120),
    "mendelian-genetics-unknown-plant": (240, 360, 480),
    "power-component": (10, 15, 20),
    "power-component-renewable-vs-nonrenewable-energy": (10, 15, 20),
    "test-conductivity": (450, 675, 900),
    "test-conductivity-of-unknown-substances": (300, 450, 600),
    "use-thermometer": (270, 405, 540),
}
FOLDS = ("train", "dev", "test")  # the run's first, second and third split draw from these
# Short tasks: their gold paths take 5 to 12 actions with the "easy" simplification.
DEFAULT_TASKS = ["find-living-thing", "find-plant", "find-animal", "find-non-living-thing"]
# "easy" (alone) means teleportAction, openDoors, selfWateringFlowerPots, plus noElectricalAction
# for the tasks that need no circuit (ScienceWorld's own preset; not openContainers).
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")
ELECTRICAL = ("power-component", "conductivity")

# ScienceWorld keeps objects in hash sets keyed by their JVM identity hash, so the order of
# the objects an observation lists (and the gold path) depends on everything the JVM did
# before: two processes gave the same item different first observations. A constant
# identity hash makes every load of an item the same, whatever the process played before.
DETERMINISTIC_JVM = "-XX:+IgnoreUnrecognizedVMOptions -XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
_SPAWN_LOCK = threading.Lock()  # JAVA_TOOL_OPTIONS is set only while a JVM starts

# Replies to an action that did nothing: not understood, or refused.
NO_MATCH = "No known action matches that input."
REFUSALS = ("You can't ", "You cannot ")
REFUSAL_ENDINGS = (" is not moveable.", " is not openable.", " is not closeable.", " is not closable.")


def fold_variations(task: str, fold: str) -> range:
    train_end, dev_end, total = TASKS[task]
    return {"train": range(0, train_end), "dev": range(train_end, dev_end), "test": range(dev_end, total)}[fold]


def is_invalid(observation: str) -> bool:
    text = observation.strip()
    return text == NO_MATCH or text.startswith(REFUSALS) or text.endswith(REFUSAL_ENDINGS)


def _check_task(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")
    return task


class SWConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(default_factory=lambda: list(DEFAULT_TASKS), min_length=1,
                             description="ScienceWorld tasks to draw items from, round robin.")
    items_per_split: dict[str, int] = Field(default_factory=lambda: {"train": 24, "val": 8, "test": 8},
                                            description="Items (task variations) per split, by split name "
                                                        "or train/val/test.")
    simplification: str = Field("easy", description=(
        "ScienceWorld simplifications, comma-separated: easy (all of them), teleportAction, "
        "selfWateringFlowerPots, openContainers, openDoors, noElectricalAction; empty for none."))
    step_limit: int = Field(100, ge=1, description="ScienceWorld ends an episode after this many moves.")

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v: list[str]) -> list[str]:
        for task in v:
            _check_task(task)
        if len(set(v)) != len(v):
            raise ValueError("a task is listed twice")
        return v

    @field_validator("simplification")
    @classmethod
    def _simplification(cls, v: str) -> str:
        parts = [p.strip() for p in v.split(",") if p.strip()]
        for p in parts:
            if p not in SIMPLIFICATIONS:
                raise ValueError(f"unknown simplification {p!r} (known: {', '.join(SIMPLIFICATIONS)})")
        if "easy" in parts and len(parts) > 1:
            raise ValueError("easy is a preset on its own: list the simplifications instead of adding to it")
        return ",".join(parts)

    @model_validator(mode="after")
    def _fits(self) -> SWConfig:
        if "noElectricalAction" in self.simplification.split(","):
            electrical = [t for t in self.tasks if any(e in t for e in ELECTRICAL)]
            if electrical:
                raise ValueError(f"noElectricalAction makes task {electrical[0]!r} impossible")
        for split, n in self.items_per_split.items():
            if n < 0:
                raise ValueError(f"items_per_split.{split} is negative")
        return self


class SWItem(BaseModel):
    """An item pinned in a data directory (DIR/<split>.jsonl)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    task_type: str = ""
    task: str
    fold: str = "train"
    variation: int = Field(ge=0)

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        return _check_task(v)

    @model_validator(mode="after")
    def _fits(self) -> SWItem:
        if self.fold not in FOLDS:
            raise ValueError(f"unknown fold {self.fold!r} (known: {', '.join(FOLDS)})")
        allowed = fold_variations(self.task, self.fold)
        if self.variation not in allowed:
            raise ValueError(f"{self.task} has {self.fold} variations {allowed.start}..{allowed.stop - 1}, "
                             f"not {self.variation}")
        self.task_type = self.task_type or self.task
        return self


class SWSession(PooledSession):
    def __init__(self, pool: ProcessPool, worker: Worker, variation: int, goal: str, observation: str,
                 step_limit: int):
        super().__init__(pool, worker)
        self.seed, self.goal, self.observation = variation, goal, observation
        self.step_limit = step_limit
        self._score = 0.0

    def step(self, action: str) -> Turn:
        if self.finished:
            return Turn(action, "The episode is over.", score=self._score, done=True, invalid=True)
        command = " ".join(action.split()).lower()
        server = self.worker.env.server
        try:
            # The server directly, as ScienceWorldEnv.step does, without the list of every valid
            # action (hundreds of strings) it builds each step: 10 ms a step instead of 90 ms.
            obs = str(server.step(command))
            points = int(round(100 * float(server.getScore())))  # ScienceWorld's score: -100..100
            completed = bool(server.getCompleted())
            moves = int(server.getNumMoves())
        except Exception as err:
            self.broken = True
            raise RuntimeError(f"env {ENV_NAME}: the world process failed: {type(err).__name__}: {err}") from err
        score = min(1.0, max(0.0, points / 100))
        reward, self._score = score - self._score, score
        success = points >= 100
        # As ScienceWorldEnv.step: a negative score (the task failed) or the move limit ends it too.
        self.finished = completed or success or points < 0 or moves > self.step_limit
        return Turn(action, obs, reward=reward, score=score, done=self.finished, success=success,
                    invalid=is_invalid(obs), info={"moves": moves, "points": points})


class ScienceWorld(PooledEpisodeEnv[SWSession]):
    """ScienceWorld tasks as episodes (env name `scienceworld`)."""

    env_name = ENV_NAME

    @classmethod
    def check_requirements(cls) -> None:
        require_package(ENV_NAME, "scienceworld")
        require_java(ENV_NAME)

    config_model = SWConfig
    item_model = SWItem

    @property
    def cfg(self) -> SWConfig:
        assert isinstance(self.config, SWConfig)
        return self.config

    @classmethod
    def builtin_splits(cls, config: BaseModel, splits: list[str]) -> dict[str, list[dict[str, Any]]]:
        assert isinstance(config, SWConfig)
        out: dict[str, list[dict[str, Any]]] = {}
        for name, default, fold in zip(splits, ("train", "val", "test"), FOLDS, strict=False):
            n = config.items_per_split.get(name, config.items_per_split.get(default, 0))
            # round robin over the tasks that still have variations of this fold
            ranges = {t: fold_variations(t, fold) for t in config.tasks}
            taken = dict.fromkeys(config.tasks, 0)
            items: list[dict[str, Any]] = []
            while len(items) < n:
                open_tasks = [t for t in config.tasks if taken[t] < len(ranges[t])]
                if not open_tasks:
                    raise ConfigError(f"env {ENV_NAME}: split {name}: {n} items, but the tasks have only "
                                      f"{len(items)} {fold} variations")
                for task in open_tasks:
                    if len(items) == n:
                        break
                    v = ranges[task][taken[task]]
                    taken[task] += 1
                    items.append({"id": f"{task}-{fold}-{v}", "task_type": task, "task": task, "fold": fold,
                                  "variation": v})
            out[name] = items
        return out

    # -- processes -------------------------------------------------------------

    def _start(self) -> Worker:
        module = require_package(ENV_NAME, "scienceworld")
        require_java(ENV_NAME)
        with _SPAWN_LOCK:
            before = os.environ.get("JAVA_TOOL_OPTIONS")
            os.environ["JAVA_TOOL_OPTIONS"] = f"{before} {DETERMINISTIC_JVM}" if before else DETERMINISTIC_JVM
            try:
                return Worker(module.ScienceWorldEnv("", envStepLimit=self.cfg.step_limit))
            finally:
                if before is None:
                    os.environ.pop("JAVA_TOOL_OPTIONS", None)
                else:
                    os.environ["JAVA_TOOL_OPTIONS"] = before

    def _load(self, worker: Worker, item: dict[str, Any], gold: bool) -> tuple[str, str]:
        """Load the item's variation into the process: (goal, first observation)."""
        task, variation = item["task"], int(item["variation"])
        if task not in TASKS or variation not in range(TASKS[task][2]):
            raise DataError(f"env {ENV_NAME}: item {item['id']}: no variation {variation} of task {task!r}")
        env = worker.env
        worker.loaded = None
        try:
            env.load(task, variation, self.cfg.simplification, generateGoldPath=gold)
        except ValueError as err:
            raise ConfigError(f"env {ENV_NAME}: task {task}: {str(err).strip()}") from None
        worker.loaded = (task, variation)
        # A loaded world is fresh: ScienceWorldEnv.reset would rebuild it again (0.2-0.7 s) before
        # this same first action.
        obs = str(env.server.step("look around"))
        return str(env.server.getTaskDescription()), obs

    def _gold_path(self, worker: Worker) -> Iterable[Any]:
        """ScienceWorld's gold path (`reference_actions` caches it per item; a process of its
        own loads it)."""
        return worker.env.get_gold_action_sequence()

    # -- episodes --------------------------------------------------------------

    def _session(self, pool: ProcessPool, worker: Worker, item: dict[str, Any], goal: str,
                 observation: str) -> SWSession:
        return SWSession(pool, worker, int(item["variation"]), goal, observation, self.cfg.step_limit)

    def default_skill(self) -> str:
        return DEFAULT_SKILL
