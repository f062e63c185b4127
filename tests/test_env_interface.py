"""One interface suite that every kind of environment runs: single-turn QA,
a plain-Python text world (the worked example), the tool-using sql env, workspace tasks, and
the real text worlds TextWorldExpress and ScienceWorld (marked `textworlds`:
they need Java and the textworlds extra)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from conftest import EXAMPLES

from skillstate.config import SkillConfig
from skillstate.envs.base import RolloutOutcome, SkillEnv
from skillstate.envs.episode import EpisodeEnv
from skillstate.envs.registry import apply_settings, env_settings, resolve_env
from skillstate.envs.tools import ToolEnv
from skillstate.envs.workspace.env import WorkspaceEnv
from skillstate.llm.base import CallResult, ChatRequest
from skillstate.log.events import CallRef
from skillstate.sim.backend import sim_backend_for
from skillstate.util import canonical_json

SPLITS = ["train", "val", "test"]
TEXTWORLDS = pytest.mark.textworlds

KINDS = [
    pytest.param(("qa", {}), id="qa"),
    pytest.param(("python:rooms_env:RoomsEnv", {}), id="rooms"),
    pytest.param(("sql", {}), id="sql"),
    pytest.param(("workspace", {}), id="workspace",
                 marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")),
    pytest.param(("textworld_express", {"games": ["coin"], "items_per_split": {"train": 4, "val": 3, "test": 3}}),
                 id="textworld_express", marks=TEXTWORLDS),
    pytest.param(("scienceworld", {"tasks": ["find-living-thing"],
                                   "items_per_split": {"train": 2, "val": 2, "test": 2}}),
                 id="scienceworld", marks=TEXTWORLDS),
]


def _build(name: str, env_config: dict) -> SkillEnv:
    if name in ("textworld_express", "scienceworld"):
        pytest.importorskip("textworld_express" if name == "textworld_express" else "scienceworld")
    cls = resolve_env(name)
    settings = env_settings(cls, env_config, name)
    splits = cls.builtin_splits(settings, SPLITS)
    if splits is None:  # qa: the bundled sim world's questions
        from skillstate.sim.world import bundled_splits

        splits = bundled_splits({"train": 6, "val": 6, "test": 6})
    env = cls(splits, settings)
    apply_settings(env, SkillConfig(env=name, episode={"max_turns": 12}, concurrency=2))
    return env


@pytest.fixture(params=KINDS)
def env(request, monkeypatch) -> SkillEnv:
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_episode"))
    built = _build(*request.param)
    yield built
    sys.modules.pop("rooms_env", None)
    close = getattr(built, "close", None)
    if callable(close):
        close()


def _complete(env: SkillEnv):
    backend = sim_backend_for(env)

    def complete(messages, tools=None) -> CallResult:
        request = ChatRequest.build("sim", "sim-target", messages, 0.0, 256, tools=tools)
        resp = backend.complete(request)
        return CallResult(CallRef(request_hash=request.hash, role="target"), text=resp.text,
                          tool_calls=resp.tool_calls)

    return complete


def _val(env: SkillEnv) -> list[dict]:
    return env.items("val")[:3]


def test_the_splits_hold_valid_items_with_unique_ids(env):
    ids = [i["id"] for split in SPLITS for i in env.items(split)]
    assert ids and len(ids) == len(set(ids))
    for split in SPLITS:
        for item in env.items(split):
            env.item_model.model_validate(item)
            assert env.item(item["id"]) == item
            json.dumps(item)  # items are stored in the log as JSON


def test_the_default_skill_is_markdown_text(env):
    skill = env.default_skill()
    assert isinstance(skill, str) and skill.strip().startswith("#")


def test_a_rollout_is_bounded_serializable_and_deterministic(env):
    prompts = _prompts()
    for item in _val(env):
        a = env.rollout(env.default_skill(), item, _complete(env), prompts)
        b = env.rollout(env.default_skill(), item, _complete(env), prompts)
        assert isinstance(a, RolloutOutcome)
        assert 0.0 <= a.hard <= 1.0 and 0.0 <= a.soft <= 1.0
        assert (a.hard == 1.0) == (not a.fail_reason)
        stored = a.trajectory if a.trajectory is not None else a.messages
        assert canonical_json(stored) == canonical_json(b.trajectory if b.trajectory is not None else b.messages)
        assert (a.hard, a.soft, a.fail_reason, a.prediction) == (b.hard, b.soft, b.fail_reason, b.prediction)
        calls = a.calls or ([a.call] if a.call else [])
        assert calls and all(c.ok for c in calls)
        if isinstance(env, (EpisodeEnv, ToolEnv)):
            assert a.turns == len(a.calls) <= env.settings.max_turns
        view = env.reflection_view(json.loads(canonical_json(stored)))
        json.dumps(view)
        assert "system" not in canonical_json(view) or not isinstance(env, EpisodeEnv)


def test_the_reference_solution_solves_the_task(env):
    for item in _val(env):
        if isinstance(env, EpisodeEnv):
            ref = env.reference_actions(item)
            assert ref is not None
            goal, first, actions = ref
            session = env.open(item, env.episode_seed(item, 0))
            try:
                assert (session.goal, session.observation) == (goal, first)
                turns = [session.step(a) for a in actions]
            finally:
                session.close()
            assert turns[-1].done and turns[-1].success, (item["id"], actions, turns[-1].observation)
            assert not any(t.done for t in turns[:-1])
        elif isinstance(env, WorkspaceEnv):
            assert env.check_solution(item, item["solution"])["exit_code"] == 0
        elif isinstance(env, ToolEnv):
            from skillstate.sim.agents import ToolWorld

            calls = env.reference_calls(item)
            assert calls
            output = [env.call_tool(item, name, args) for name, args in calls][-1]
            assert env.score(ToolWorld.read_output(output), item)[0] == 1.0
        else:
            assert env.score(item["answers"][0], item)[0] == 1.0  # type: ignore[attr-defined]


# the workspace kind runs every check in a real sandbox, twice per item: 20 to 40 s, so in the slow suite
RULES_KINDS = [pytest.param(*p.values, id=p.id, marks=[*p.marks, *([pytest.mark.slow] if p.id == "workspace" else [])])
               for p in KINDS]


@pytest.mark.parametrize("env", RULES_KINDS, indirect=True)
def test_a_skill_with_the_right_rules_does_better_in_the_sim(env):
    """The sim target's competence depends on the skill, in every kind of world."""
    from skillstate.sim.backend import sim_world_for

    world = sim_world_for(env)
    items = env.items("val") + env.items("test")
    kinds = sorted({k for i in items for k in ([i.get("task_type", "")] if not isinstance(env, EpisodeEnv)
                                              else ["doors", "navigation", "objects", "observation", "focus",
                                                    "recipe", "devices"])})
    good = env.default_skill() + "\n" + "\n".join(f"- {world.rule_for(k).variants[0]}" for k in kinds) + "\n"
    prompts = _prompts()
    score = lambda skill: sum(env.rollout(skill, i, _complete(env), prompts).hard for i in items)  # noqa: E731
    assert score(good) >= score(env.default_skill())


def _prompts() -> dict[str, str]:
    from skillstate.prompts import resolve_prompts

    return resolve_prompts({})
