"""ETO's ALFWorld trajectories read as `bank.trajectories`."""

from __future__ import annotations

import json

import pytest
from conftest import small_config

from skillstate.bank.eto_format import category, from_eto, is_eto, trajectories_from_text
from skillstate.errors import DataError
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

INSTRUCTIONS = "Interact with a household to solve a task. Reply with Thought: ... then Action: ..."


def eto(record_id: str, task: str, actions: list[str], **extra) -> dict:
    turns = [{"from": "human", "value": INSTRUCTIONS}, {"from": "gpt", "value": "OK"},
             {"from": "human", "value": f"You are in the middle of a room.\nYour task is to: {task}"}]
    for n, action in enumerate(actions):
        turns.append({"from": "gpt", "value": f"Thought: step {n}.\nAction: {action}"})
        turns.append({"from": "human", "value": f"Observation {n}."})
    return {"id": record_id, "conversations": turns, **extra}


def test_an_eto_record_becomes_a_trajectory():
    t = from_eto(eto("pick_heat_then_place_in_recep-Egg-None-Fridge-1/trial_1", "heat some egg and put it in fridge.",
                     ["go to microwave 1", "heat egg 1 with microwave 1"]), "record 1")
    assert t.task_description == "heat some egg and put it in fridge."
    assert t.task_category == "pick_heat_then_place_in_recep" and t.success and t.total_reward == 1.0
    assert [s.action for s in t.steps] == ["go to microwave 1", "heat egg 1 with microwave 1"]
    assert t.steps[0].observation.endswith("Your task is to: heat some egg and put it in fridge.")
    assert t.steps[1].observation == "Observation 0." and [s.step_index for s in t.steps] == [0, 1]


def test_reward_success_and_category_from_wording():
    failed = from_eto(eto("x1", "put a clean cloth in cabinet.", ["look"], reward=0.0), "record 1")
    assert not failed.success and failed.total_reward == 0.0 and failed.task_category.startswith("pick_clean")
    assert category("42", "look at bowl under the desklamp.") == "look_at_obj_in_light"
    assert category("43", "put a pen in drawer.") == "pick_and_place_simple"


def test_detection_keeps_the_spec_format_and_checks_eto_records():
    spec = [{"id": "a", "task_description": "t", "task_category": "c", "total_reward": 1.0, "success": True,
             "steps": [{"observation": "o", "action": "a", "step_index": 0}]}]
    assert not is_eto(spec) and trajectories_from_text(json.dumps(spec))[0].id == "a"
    both = trajectories_from_text(json.dumps([eto("a", "cool an apple.", ["go"]), eto("b", "cool it.", ["go"])]))
    assert [t.id for t in both] == ["a", "b"]
    with pytest.raises(DataError, match="duplicate id"):
        trajectories_from_text(json.dumps([eto("a", "t", ["go"]), eto("a", "t", ["go"])]))
    with pytest.raises(DataError, match="record 1"):
        trajectories_from_text(json.dumps([{"id": "z", "conversations": ["not a turn"]}]))


def test_a_bank_run_is_seeded_from_an_eto_file(tmp_path):
    path = tmp_path / "eto.json"
    path.write_text(json.dumps([eto(f"e{i}", "heat some egg.", ["heat egg 1"]) for i in range(4)]), encoding="utf-8")
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    Trainer(small_config(mode="bank", num_epochs=1, bank={"trajectories": str(path)}), store=store,
            run_id="e").train()
    from skillstate.engine.loading import load_run

    state = load_run(store, "e").state
    imported = json.loads(store.get_blob(state.trajectories))
    assert [t["id"] for t in imported] == ["e0", "e1", "e2", "e3"] and state.seeded
    assert all(t["metadata"] == {"source": "eto"} for t in imported)
