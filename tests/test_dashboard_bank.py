"""The dashboard's pages for a skill-bank run, an evaluation run and an
episode environment's trajectories (Starlette's test client, sim runs): bank
steps labelled with what they did, bank diffs as tables, the config summary,
an evaluation run's own page and a trajectory opened from a step."""

from __future__ import annotations

import sys
from html import unescape

import pytest
from conftest import EXAMPLES, small_config
from starlette.testclient import TestClient

from skillstate.config import SkillConfig
from skillstate.dashboard.app import create_app
from skillstate.dashboard.store_view import open_read_only
from skillstate.engine.loading import load_run
from skillstate.log.events import GateDecided
from skillstate.log.events_bank import BankValidated, SkillsDistilled
from skillstate.storage.store import Store
from skillstate.trainer import Trainer, evaluate_skill


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashbank")
    url = f"sqlite:///{tmp / 'runs.db'}"
    store = Store(url)
    Trainer(small_config(num_epochs=1, mode="bank"), store=store, run_id="bank").train()
    Trainer(small_config(num_epochs=1, mode="bank", seed=7), store=store, run_id="bank2").train()
    skill = tmp / "skill.md"
    skill.write_text("# QA\n\nAnswer with the final answer only. <b>bold</b>\n", encoding="utf-8")
    evaluate_skill(small_config(initial_skill=str(skill)), "test", store=store, run_id="ev")
    sys.path.insert(0, str(EXAMPLES / "custom_episode"))
    try:
        Trainer(SkillConfig(env="python:rooms_env:RoomsEnv", num_epochs=1, batch_size=6, minibatch_size=3,
                            episode={"max_turns": 6}), store=store, run_id="rooms").train()
    finally:
        sys.path.remove(str(EXAMPLES / "custom_episode"))
        sys.modules.pop("rooms_env", None)
    store.close()
    read = open_read_only(url)
    with TestClient(create_app(read)) as client:
        yield read, client
    read.close()


def page(client, url: str) -> str:
    r = client.get(url)
    assert r.status_code == 200, (url, r.text[:500])
    return r.text


def test_a_bank_run_page_labels_each_step_and_has_no_edit_budget(world):
    store, client = world
    html = page(client, "/runs/bank")
    assert 'id="budget-chart"' not in html and "<th>Budget" not in html and "What the step did" in html
    text = unescape(html)
    assert "distilled" in text and "validated" in text and "gated: accepted" in text
    assert "skipped</span>" not in text
    plain = page(client, "/runs/ev")  # other runs keep theirs; the eval run has a page of its own
    assert 'id="budget-chart"' not in plain


def test_a_bank_step_page_shows_drops_rates_evolution_and_a_bank_diff(world):
    store, client = world
    loaded = load_run(store, "bank")
    validated = next(s.event for s in loaded.lineage if isinstance(s.event, BankValidated))
    text = unescape(page(client, f"/runs/bank/steps/{validated.step}"))
    assert 'id="validation-rates"' in text and 'id="evolve-rates"' in text and 'id="bank-diff"' in text
    for category, score in validated.scores.by_task_type.items():
        assert f"{category}</td><td class=\"num\">{score.n}</td><td class=\"num\">{score.hard:.3f}" in text
    assert '{"mistakes"' not in text and "budget" not in text.split("<h1>")[1].split("</h1>")[0]
    dropped = [(s.step, d) for s in loaded.lineage if isinstance(s.event, SkillsDistilled) for d in s.event.dropped]
    if dropped:
        step, d = dropped[0]
        text = unescape(page(client, f"/runs/bank/steps/{step}"))
        assert d.skill.title in text and d.reason.replace("_", " ") in text


def test_comparing_two_bank_runs_is_a_table_of_skills(world):
    _, client = world
    text = unescape(page(client, "/compare?a=bank&b=bank2"))
    assert "Best banks: A → B" in text and 'class="grid bank-diff"' in text and '{"mistakes"' not in text


def test_every_run_page_summarizes_its_config(world):
    _, client = world
    for rid in ("bank", "ev", "rooms"):
        text = unescape(page(client, f"/runs/{rid}"))
        assert 'id="config"' in text and "target sim-target" in text and "<details>" in text
        assert "api_key_env" in text  # the full config folds away, naming keys by their variable only


def test_an_eval_run_has_its_own_page(world):
    store, client = world
    ev = load_run(store, "ev").state.tests["eval"]
    html = page(client, "/runs/ev")
    text = unescape(html)
    assert "Best (val)" not in text and "not yet" not in text and 'id="curve-chart"' not in html
    assert "Answer with the final answer only. <b>bold</b>" in text and "<b>bold</b>" not in html  # escaped
    assert f"{ev.split} (eval)" in text and f"{ev.scores.hard:.3f}" in text
    for task_type in ev.scores.by_task_type:
        assert f"<td>{task_type}</td>" in text
    assert html.count('href="/runs/ev/items/') == ev.scores.n
    link = html.split('href="/runs/ev/items/')[1].split('"')[0].replace("&amp;", "&")
    item = page(client, "/runs/ev/items/" + link)
    assert 'id="trajectory"' in item and "Result:" in item


def test_an_episode_trajectory_opens_from_its_step(world):
    store, client = world
    html = page(client, "/runs/rooms/steps/1")
    link = html.split('href="/runs/rooms/items/')[1].split('"')[0].replace("&amp;", "&")
    text = unescape(page(client, "/runs/rooms/items/" + link))
    assert "Goal:" in text and "<th>Action</th>" in text
    assert client.get("/runs/rooms/items/nope?step=1").status_code == 404
    assert client.get("/runs/rooms/items/x").status_code == 404


def test_bank_gate_decisions_on_the_page_match_the_log(world):
    store, client = world
    loaded = load_run(store, "bank")
    gated = [s.event for s in loaded.lineage if isinstance(s.event, GateDecided) and s.event.decision != "skip"]
    text = unescape(page(client, "/runs/bank"))
    assert text.count("gated: ") == len(gated)
