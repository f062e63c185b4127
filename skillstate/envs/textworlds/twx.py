"""TextWorldExpress (`pip install textworld-express`, Java on PATH): fast
procedurally generated text games, e.g. Coin Collector (explore a house, find
the coin, take it) and CookingWorld (gather and prepare the ingredients of a
recipe, then cook and eat the meal).

Items need no data files: each is (game, fold, seed, game parameters). The
run's train, val and test splits draw from TWX's train, dev and test folds,
whose games are generated from disjoint seed ranges and object sets. An
episode resets a pooled JVM process with the item's own seed, so every
rollout of an item plays the same game.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skillstate.envs.episode import Turn
from skillstate.envs.textworlds.java import require_java, require_package
from skillstate.envs.textworlds.pool import PooledSession, ProcessPool, Worker
from skillstate.envs.textworlds.pooled import PooledEpisodeEnv
from skillstate.errors import ConfigError

ENV_NAME = "textworld_express"

DEFAULT_SKILL = """# Text-world agent

You act in a text world, one command per turn, to complete the task.

- Read the task and the latest observation before choosing an action.
- Reply with exactly one command, e.g. `Action: open door to north`.
- Go to places you have not seen yet when what you need is not in sight.
- If an action fails, try a different verb at random.
"""

# The games and the parameters each accepts (textworld-express 1.1.0).
GAME_PARAMS: dict[str, tuple[str, ...]] = {
    "cookingworld": ("numLocations", "numIngredients", "numDistractorItems", "includeDoors", "limitInventorySize"),
    "twc": ("numLocations", "numItemsToPutAway", "includeDoors", "limitInventorySize"),
    "coin": ("numLocations", "numDistractorItems", "includeDoors", "limitInventorySize"),
    "mapreader": ("numLocations", "maxDistanceApart", "maxDistractorItemsPerLocation", "includeDoors",
                  "limitInventorySize"),
    "arithmetic": (),
    "sorting": (),
    "simonsays": ("gameLength", "numDistractors", "memorization", "verbose"),
    "peckingorder": (),
}
GAMES = tuple(GAME_PARAMS)

# Small games (mean gold path: coin 7 actions, cookingworld 20, twc 6, mapreader 8).
DEFAULT_PARAMS: dict[str, str] = {
    "coin": "numLocations=4,includeDoors=1,numDistractorItems=0,limitInventorySize=0",
    "cookingworld": "numLocations=3,numIngredients=2,numDistractorItems=0,includeDoors=1,limitInventorySize=0",
    "twc": "numLocations=1,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0",
    "mapreader": "numLocations=4,maxDistanceApart=2,maxDistractorItemsPerLocation=0,includeDoors=0,"
                 "limitInventorySize=0",
    "simonsays": "gameLength=5,numDistractors=3,memorization=0",
}

# Each fold's seeds (getValidSeedsTrain/Dev/Test, the same for every game).
FOLD_SEEDS: dict[str, range] = {"train": range(0, 1000), "dev": range(10000, 11000), "test": range(20000, 21000)}
FOLDS = tuple(FOLD_SEEDS)  # the run's first, second and third split draw from these

UNKNOWN_ACTION = "Unknown action"  # TWX's reply to anything outside the valid actions


def normalize_params(game: str, params: str) -> str:
    """A game-parameter string as `k=v,k=v` (spaces dropped); a ValueError
    names a malformed pair or a key the game does not know."""
    pairs = []
    for part in (p.strip() for p in params.split(",")):
        if not part:
            continue
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not key or not value.lstrip("-").isdigit():
            raise ValueError(f"{game}: {part!r} is not NAME=INTEGER")
        if key not in GAME_PARAMS[game]:
            known = ", ".join(GAME_PARAMS[game]) or "none"
            raise ValueError(f"{game} has no parameter {key!r} (known: {known})")
        pairs.append(f"{key}={int(value)}")
    return ",".join(pairs)


def _check_game(game: str) -> str:
    if game not in GAME_PARAMS:
        raise ValueError(f"unknown game {game!r} (known: {', '.join(GAMES)})")
    return game


class TWXConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    games: list[str] = Field(default_factory=lambda: ["cookingworld"], min_length=1,
                             description=f"Games to draw items from, round robin: {', '.join(GAMES)}.")
    params: dict[str, str] = Field(default_factory=dict, description=(
        "Game -> TWX gameParams string, e.g. coin: 'numLocations=4,includeDoors=1'. A game left out gets "
        "skillstate's default for it (stored in the run's config)."))
    items_per_split: dict[str, int] = Field(default_factory=lambda: {"train": 80, "val": 20, "test": 20},
                                            description="Items per split (by split name or train/val/test).")
    step_limit: int = Field(100, ge=1, description="TWX ends an episode after this many actions.")

    @field_validator("games")
    @classmethod
    def _games(cls, v: list[str]) -> list[str]:
        for game in v:
            _check_game(game)
        if len(set(v)) != len(v):
            raise ValueError("a game is listed twice")
        return v

    @field_validator("items_per_split")
    @classmethod
    def _counts(cls, v: dict[str, int]) -> dict[str, int]:
        for split, n in v.items():
            if n < 0:
                raise ValueError(f"{split}: {n} items")
        return v

    @model_validator(mode="after")
    def _params(self) -> TWXConfig:
        extra = sorted(set(self.params) - set(self.games))
        if extra:
            raise ValueError(f"params for {extra[0]!r}, which is not in games")
        self.params = {g: normalize_params(g, self.params.get(g, DEFAULT_PARAMS.get(g, ""))) for g in self.games}
        return self


class TWXItem(BaseModel):
    """An item pinned in a data directory (DIR/<split>.jsonl); `params`
    left out means the config's params for the game."""

    model_config = ConfigDict(extra="forbid")

    id: str
    task_type: str = ""
    game: str
    fold: str = "train"
    seed: int = Field(ge=0)
    params: str | None = None

    @field_validator("game")
    @classmethod
    def _game(cls, v: str) -> str:
        return _check_game(v)

    @field_validator("fold")
    @classmethod
    def _fold(cls, v: str) -> str:
        if v not in FOLD_SEEDS:
            raise ValueError(f"unknown fold {v!r} (known: {', '.join(FOLDS)})")
        return v

    @model_validator(mode="after")
    def _fill(self) -> TWXItem:
        self.task_type = self.task_type or self.game
        if self.params is not None:
            self.params = normalize_params(self.game, self.params)
        return self


class TWXSession(PooledSession):
    def __init__(self, pool: ProcessPool, worker: Worker, seed: int, goal: str, observation: str):
        super().__init__(pool, worker)
        self.seed, self.goal, self.observation = seed, goal, observation
        self._score = 0.0

    def step(self, action: str) -> Turn:
        if self.finished:
            return Turn(action, "The episode is over.", score=self._score, done=True, invalid=True)
        command = " ".join(action.split())
        try:
            obs, _reward, done, infos = self.worker.env.step(command.lower())
        except Exception as err:
            self.broken = True
            raise RuntimeError(f"env {ENV_NAME}: the game process failed: {type(err).__name__}: {err}") from err
        score = min(1.0, max(0.0, float(infos.get("score", 0.0))))
        reward, self._score = score - self._score, score
        success = bool(infos.get("tasksuccess"))
        self.finished = bool(done) or success or bool(infos.get("taskfailure"))
        return Turn(action, obs, reward=reward, score=score, done=self.finished, success=success,
                    invalid=obs.strip().startswith(UNKNOWN_ACTION), info={"moves": infos.get("numMoves")})


class TextWorldExpress(PooledEpisodeEnv[TWXSession]):
    """TextWorldExpress games as episodes (env name `textworld_express`)."""

    env_name = ENV_NAME

    @classmethod
    def check_requirements(cls) -> None:
        require_package(ENV_NAME, "textworld_express")
        require_java(ENV_NAME)

    config_model = TWXConfig
    item_model = TWXItem

    @property
    def cfg(self) -> TWXConfig:
        assert isinstance(self.config, TWXConfig)
        return self.config

    @classmethod
    def builtin_splits(cls, config: BaseModel, splits: list[str]) -> dict[str, list[dict[str, Any]]]:
        assert isinstance(config, TWXConfig)
        out: dict[str, list[dict[str, Any]]] = {}
        for name, default, fold in zip(splits, ("train", "val", "test"), FOLDS, strict=False):
            n = config.items_per_split.get(name, config.items_per_split.get(default, 0))
            games = config.games
            if n > len(FOLD_SEEDS[fold]) * len(games):
                raise ConfigError(f"env {ENV_NAME}: split {name}: {n} items, but TWX has {len(FOLD_SEEDS[fold])} "
                                  f"{fold} seeds per game")
            items = []
            for k in range(n):
                game, seed = games[k % len(games)], FOLD_SEEDS[fold][k // len(games)]
                items.append({"id": f"{game}-{fold}-{seed}", "task_type": game, "game": game, "fold": fold,
                              "seed": seed, "params": config.params[game]})
            out[name] = items
        return out

    # -- processes -------------------------------------------------------------

    def _start(self) -> Worker:
        module = require_package(ENV_NAME, "textworld_express")
        require_java(ENV_NAME)
        return Worker(module.TextWorldExpressEnv(envStepLimit=self.cfg.step_limit))

    def _params(self, item: dict[str, Any]) -> str:
        params = item.get("params")
        if params is None:  # a pinned item without its own: the config's, else skillstate's default
            params = self.cfg.params.get(item["game"]) or normalize_params(item["game"], DEFAULT_PARAMS.get(
                item["game"], ""))
        return str(params)

    def _load(self, worker: Worker, item: dict[str, Any], gold: bool) -> tuple[str, str]:
        """Reset the process to the item's game: (goal, first observation)."""
        game, params = item["game"], self._params(item)
        env = worker.env
        try:
            if worker.loaded == (game, params):  # reloading the same game costs 20 ms, a reset 1 ms
                obs, infos = env.reset(seed=int(item["seed"]), gameFold=item["fold"], generateGoldPath=gold)
            else:
                worker.loaded = None
                obs, infos = env.reset(seed=int(item["seed"]), gameFold=item["fold"], gameName=game,
                                       gameParams=params, generateGoldPath=gold)
                worker.loaded = (game, params)
        except ValueError as err:  # TWX refuses the parameters (a value out of range, say)
            raise ConfigError(f"env {ENV_NAME}: game {game} with params {params!r}: {str(err).strip()}") from None
        return str(infos["taskDescription"]), str(obs)

    def _gold_path(self, worker: Worker) -> Iterable[Any]:
        """TWX's gold path (`reference_actions` caches it per item). TWX finds it by a random
        walk from an unseeded `new Random()`, so it can differ between processes (the game
        itself does not)."""
        return worker.env.getGoldActionSequence()

    # -- episodes --------------------------------------------------------------

    def _session(self, pool: ProcessPool, worker: Worker, item: dict[str, Any], goal: str,
                 observation: str) -> TWXSession:
        return TWXSession(pool, worker, int(item["seed"]), goal, observation)

    def default_skill(self) -> str:
        return DEFAULT_SKILL
