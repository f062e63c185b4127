"""The JVM text worlds: TextWorldExpress and ScienceWorld.

Item generation, config checks, the process pool and the Java check run
everywhere; playing the worlds needs their packages and Java (marked
`textworlds`, skipped when a package cannot be imported)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from skillstate.envs.episode import EpisodeSettings
from skillstate.envs.episode_loop import run_episode
from skillstate.envs.registry import env_settings
from skillstate.envs.textworlds import java as javamod
from skillstate.envs.textworlds.pool import PooledSession, ProcessPool, Worker
from skillstate.envs.textworlds.scienceworld import ScienceWorld
from skillstate.envs.textworlds.twx import TextWorldExpress
from skillstate.errors import ConfigError
from skillstate.llm.base import CallResult
from skillstate.log.values import CallRef
from skillstate.prompts import builtin
from skillstate.util import install_hint

SPLITS = ["train", "val", "test"]


def make(cls: Any, raw: dict[str, Any] | None = None, workers: int = 2, names: list[str] = SPLITS) -> Any:
    config = env_settings(cls, raw or {}, cls.__name__)
    env = cls(cls.builtin_splits(config, names), config)
    env.settings = EpisodeSettings(workers=workers)
    return env


def play(env: Any, item: dict[str, Any], actions: list[str]) -> list[Any]:
    session = env.open(item, 12345)
    turns = []
    try:
        for action in actions:
            turns.append(session.step(action))
            if turns[-1].done:
                break
    finally:
        session.close()
    return turns


# --- items and config (no packages needed) ------------------------------------


def test_twx_items_are_deterministic_and_draw_each_split_from_its_own_fold():
    config = env_settings(TextWorldExpress, {"games": ["coin", "cookingworld"]}, "twx")
    a = TextWorldExpress.builtin_splits(config, ["tr", "va", "te"])
    assert a == TextWorldExpress.builtin_splits(config, ["tr", "va", "te"])
    assert [len(a[s]) for s in ("tr", "va", "te")] == [80, 20, 20]
    assert [i["fold"] for i in a["va"]] == ["dev"] * 20 and {i["fold"] for i in a["te"]} == {"test"}
    assert [(i["game"], i["seed"]) for i in a["tr"][:4]] == [("coin", 0), ("cookingworld", 0), ("coin", 1),
                                                               ("cookingworld", 1)]
    assert a["va"][0] == {"id": "coin-dev-10000", "task_type": "coin", "game": "coin", "fold": "dev",
                          "seed": 10000, "params": config.params["coin"]}
    assert {i["seed"] for i in a["te"]} <= set(range(20000, 21000))
    ids = [i["id"] for s in a.values() for i in s]
    assert len(ids) == len(set(ids))
    # a game left out of params gets the default, stored in the validated config
    assert config.params["cookingworld"].startswith("numLocations=3,numIngredients=2")


def test_scienceworld_items_are_deterministic_and_round_robin_over_the_tasks():
    config = env_settings(ScienceWorld, {}, "sw")
    a = ScienceWorld.builtin_splits(config, SPLITS)
    assert a == ScienceWorld.builtin_splits(config, SPLITS)
    assert [len(a[s]) for s in SPLITS] == [24, 8, 8]
    assert [i["task"] for i in a["train"][:4]] == config.tasks
    assert a["val"][0] == {"id": "find-living-thing-dev-150", "task_type": "find-living-thing",
                           "task": "find-living-thing", "fold": "dev", "variation": 150}
    assert {i["fold"] for i in a["test"]} == {"test"} and all(i["variation"] >= 225 for i in a["test"])


@pytest.mark.parametrize("cls,raw,words", [
    (TextWorldExpress, {"games": ["chess"]}, "unknown game 'chess'"),
    (TextWorldExpress, {"games": ["coin"], "params": {"coin": "numRooms=3"}}, "coin has no parameter 'numRooms'"),
    (TextWorldExpress, {"games": ["coin"], "params": {"coin": "numLocations=many"}}, "not NAME=INTEGER"),
    (TextWorldExpress, {"params": {"twc": "numLocations=1"}}, "not in games"),
    (TextWorldExpress, {"seed": 3}, "has no such setting"),
    (ScienceWorld, {"tasks": ["find-unicorn"]}, "unknown task 'find-unicorn'"),
    (ScienceWorld, {"simplification": "easy,openDoors"}, "easy is a preset on its own"),
    (ScienceWorld, {"simplification": "fast"}, "unknown simplification 'fast'"),
    (ScienceWorld, {"tasks": ["power-component"], "simplification": "noElectricalAction"}, "impossible"),
])
def test_bad_env_config_is_one_config_error(cls, raw, words):
    with pytest.raises(ConfigError) as err:
        env_settings(cls, raw, "x")
    assert words in str(err.value) and "\n" not in str(err.value)


def test_too_many_items_for_a_fold_is_a_config_error():
    config = env_settings(ScienceWorld, {"tasks": ["identify-life-stages-2"],
                                         "items_per_split": {"train": 4, "val": 3, "test": 1}}, "sw")
    with pytest.raises(ConfigError, match="only 2 dev variations"):
        ScienceWorld.builtin_splits(config, SPLITS)


def test_pinned_items_are_validated(tmp_path):
    for split in SPLITS:
        (tmp_path / f"{split}.jsonl").write_text(f'{{"id": "{split}", "game": "coin", "seed": 3}}\n')
    splits = TextWorldExpress.load_splits(tmp_path, SPLITS)
    assert splits["val"] == [{"id": "val", "task_type": "coin", "game": "coin", "fold": "train", "seed": 3}]
    (tmp_path / "val.jsonl").write_text('{"id": "v", "task": "find-plant", "fold": "train", "variation": 200}\n')
    with pytest.raises(Exception, match="train variations 0..149, not 200"):
        ScienceWorld.load_splits(tmp_path, ["val"])


# --- Java and the packages -----------------------------------------------------


def test_require_java_is_one_config_error_without_java(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError) as err:
        javamod.require_java("textworld_express")
    msg = str(err.value)
    assert "\n" not in msg and "needs Java 8+ on PATH" in msg and "openjdk-17-jre-headless" in msg


def test_require_java_reads_old_and_new_version_strings(monkeypatch, tmp_path):
    assert javamod.java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert javamod.java_major('java version "1.8.0_292"') == 8
    assert javamod.java_major('openjdk version "21" 2023-09-19') == 21
    fake = tmp_path / "java"
    fake.write_text('#!/bin/sh\necho \'java version "1.7.0_80"\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="is Java 7"):
        javamod.require_java("scienceworld")


def test_a_missing_package_names_the_extra():
    with pytest.raises(ConfigError) as err:
        javamod.require_package("textworld_express", "textworld_express_not_installed")
    assert str(err.value) == f"env textworld_express needs the textworlds extra: {install_hint('textworlds')}"


# --- the pool (fake processes) ------------------------------------------------


class FakeEnv:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_pool_lends_at_most_limit_processes_reads_the_limit_late_and_stops_them():
    workers = {"n": 99}
    made: list[Worker] = []

    def start() -> Worker:
        time.sleep(0.01)
        made.append(Worker(FakeEnv()))
        return made[-1]

    pool = ProcessPool(start, lambda: workers["n"])
    workers["n"] = 2  # set after construction, as settings are
    busy, peak, lock = [0], [0], threading.Lock()

    def one():
        with pool.lease():
            with lock:
                busy[0] += 1
                peak[0] = max(peak[0], busy[0])
            time.sleep(0.02)
            with lock:
                busy[0] -= 1

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.limit == 2 and pool.peak <= 2 and pool.started == len(made) <= 2 and peak[0] == 2
    worker = pool.acquire()
    pool.release(worker, discard=True)  # a failed process is stopped, not reused
    assert worker.env.closed and pool.alive() == len(made) - 1
    pool.close()
    assert all(w.env.closed for w in made) and pool.alive() == 0
    session = PooledSession(pool, pool.acquire())  # usable again after close; a session gives it back
    session.close()
    session.close()
    assert pool.alive() == 1


# --- TextWorldExpress ----------------------------------------------------------


@pytest.fixture(scope="module")
def coin():
    pytest.importorskip("textworld_express")
    env = make(TextWorldExpress, {"games": ["coin"]}, workers=2)
    yield env
    env.close()


@pytest.mark.textworlds
def test_twx_gold_actions_solve_every_val_item(coin):
    for item in coin.items("val"):
        goal, first, gold = coin.reference_actions(item)
        session = coin.open(item, 777)
        assert (session.goal, session.observation, session.seed) == (goal, first, item["seed"])
        session.close()
        assert "find the coin" in goal and gold
        turns = play(coin, item, gold)
        assert turns[-1].done and turns[-1].success and turns[-1].score == 1.0, item
        assert len(turns) == len(gold)


@pytest.mark.textworlds
def test_twx_invalid_action_is_flagged_and_the_episode_ends_when_done(coin):
    item = coin.items("val")[0]
    turns = play(coin, item, ["fly to the moon", "look around"])
    assert turns[0].invalid and turns[0].observation.startswith("Unknown action") and turns[0].score == 0.0
    assert not turns[1].invalid
    gold = coin.reference_actions(item)[2]
    session = coin.open(item, 0)
    for action in gold:
        last = session.step(action)
    after = session.step("look around")  # the world is not stepped after the episode ended
    session.close()
    assert last.success and after.done and after.invalid


@pytest.mark.textworlds
def test_twx_pool_never_holds_more_processes_than_workers(coin):
    env = make(TextWorldExpress, {"games": ["coin"]}, workers=2)
    items = env.items("val")[:8]
    golds = {i["id"]: coin.reference_actions(i)[2] for i in items}
    results: dict[str, bool] = {}

    def one(item):
        turns = play(env, item, golds[item["id"]])
        results[item["id"]] = turns[-1].success

    threads = [threading.Thread(target=one, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool = env.pool()
    assert all(results.values()) and len(results) == 8
    assert pool.peak <= 2 and pool.started <= 2 and pool.alive() <= 2
    env.close()
    assert pool.alive() == 0


@pytest.mark.textworlds
def test_twx_episode_through_the_episode_loop(coin):
    item = coin.items("val")[1]
    gold = coin.reference_actions(item)[2]
    replies = iter(f"Thought: go on.\nAction: {a}" for a in gold)

    def complete(messages, tools=None):
        assert messages[0]["content"] == coin.default_skill()
        return CallResult(ref=CallRef(request_hash="h", role="target"), text=next(replies))

    out = run_episode(coin, coin.default_skill(), item, complete, {"episode_user": builtin("episode_user")})
    assert out.hard == 1.0 and out.soft == 1.0 and out.turns == len(gold) and out.seed == item["seed"]
    assert out.trajectory["goal"].startswith("Your task is to search")


def test_default_skill_holds_the_weak_rule():
    skill = make(TextWorldExpress).default_skill()
    assert skill == make(ScienceWorld).default_skill()
    assert skill.startswith("# Text-world agent\n") and "- If an action fails, try a different verb at random." in skill


# --- ScienceWorld (slow: one JVM, a few episodes) ------------------------------


@pytest.mark.textworlds
def test_scienceworld_gold_solves_and_observations_do_not_depend_on_the_process():
    pytest.importorskip("scienceworld")
    env = make(ScienceWorld, {"tasks": ["find-non-living-thing"],
                              "items_per_split": {"train": 1, "val": 2, "test": 1}}, workers=1)
    try:
        first_opens = {}
        for item in env.items("val"):
            goal, first, gold = env.reference_actions(item)  # a process of its own, which also made the gold path
            turns = play(env, item, gold)
            assert turns[-1].done and turns[-1].success and turns[-1].score == 1.0, item
            assert not any(t.invalid for t in turns)
            session = env.open(item, 0)
            first_opens[item["id"]] = session.observation
            assert (session.goal, session.observation, session.seed) == (goal, first, item["variation"])
            session.close()
        item = env.items("val")[0]
        turns = play(env, item, ["fly to the moon", "focus on door"])
        assert turns[0].invalid and turns[0].observation == "No known action matches that input."
        assert turns[1].observation.startswith("Ambiguous request") and not turns[1].invalid
        session = env.open(item, 0)
        assert session.observation == first_opens[item["id"]]  # after other episodes: the same
        session.close()
    finally:
        env.close()
