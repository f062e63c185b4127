"""The dashboard on policy training runs (kind policy): the runs list names their kind and method, and a
policy run's page shows the model (path, sha256), the source run, the method, the trainer's and LoRA's
settings, the steps and seconds per step, a chart per logged curve (the data embedded as the log holds it),
the validations per category, the evolutions of the bank and the checkpoints; never a skill run's panels.
Marker `policy` (the train extra)."""

from __future__ import annotations

import json
import re

import pytest
from policy_runs import policy_database
from starlette.testclient import TestClient

from skillstate.dashboard.app import create_app
from skillstate.dashboard.store_view import open_read_only
from skillstate.engine.runner import load_run
from skillstate.reading.policy_view import curves
from skillstate.storage.store import Store

pytestmark = pytest.mark.policy


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    pytest.importorskip("trl")
    url = policy_database(tmp_path_factory.mktemp("dashpolicy"))
    store = open_read_only(url)
    with TestClient(create_app(store, allowed_hosts=["testserver"])) as c:
        yield c, Store(url)
    store.close()


def embedded(html: str, element_id: str):
    found = re.search(rf'<script type="application/json" id="{element_id}"[^>]*>(.*?)</script>', html, re.S)
    assert found, element_id
    return json.loads(found.group(1))


def section(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start:html.index("</section>", start)]


def test_the_runs_list_shows_policy_runs_with_their_kind(world):
    client, _store = world
    page = client.get("/")
    assert page.status_code == 200
    for rid, method in (("sft", "sft"), ("grpo", "grpo")):
        row = re.search(rf'<tr data-run="{rid}">(.*?)</tr>', page.text, re.S).group(1)
        assert f"policy · {method}" in row and "completed" in row
    rows = {r["run_id"]: r for r in client.get("/api/runs").json()}
    assert rows["grpo"]["mode"] == "policy" and rows["grpo"]["method"] == "grpo"
    assert rows["grpo"]["steps"] == 4 and rows["grpo"]["total_steps"] == 4
    assert rows["bank"]["mode"] == "bank" and "method" not in rows["bank"]


@pytest.mark.parametrize("rid", ["sft", "grpo"])
def test_a_policy_runs_page_shows_the_model_the_trainer_the_curves_and_the_checkpoints(world, rid):
    client, store = world
    page = client.get(f"/runs/{rid}")
    assert page.status_code == 200
    html = page.text
    p = load_run(store, rid).state.policy
    s = p.started
    model = section(html, "policy-model")
    assert s.base_model.path in model and s.base_model.sha256 in model and 'href="/runs/bank"' in model
    assert f"<td>{rid}</td>" in model
    trainer = section(html, "policy-trainer")
    assert "LoRA" in trainer and re.search(r"<td>r</td><td class=\"mono\">8</td>", trainer)
    assert re.search(r"<td>max_steps</td><td class=\"mono\">4</td>", trainer)
    cards = section(html, "policy-cards")
    assert re.search(r'id="policy-steps">4 / 4<', cards) and "s per step" in cards
    data = embedded(html, "policy-data")
    assert {k: [tuple(x) for x in v] for k, v in data["curves"].items()} == curves(p)
    charted = re.findall(r'data-chart="metric" data-metric="([^"]+)"', html)
    assert charted[0] == "loss" and "learning_rate" in charted
    assert ("reward" in charted) == (rid == "grpo")
    assert all(name in data["curves"] for name in charted)
    table = section(html, "policy-validations")
    assert 'data-chart="validations"' in table
    assert len(re.findall(r"<tr><td class=\"num\">", table)) == len(p.validated)
    for category in p.validated[0].scores.by_task_type:
        assert f"<th class=\"num\">{category}</th>" in table
    checkpoints = section(html, "policy-checkpoints")
    for t in p.trained:
        assert t.checkpoint.path in checkpoints and t.checkpoint.sha256 in checkpoints
    assert "Learning curve" not in html and "Edit budget" not in html  # not drawn as a skill run
    if rid == "grpo":
        (e,) = p.evolved
        evolutions = section(html, "policy-evolutions")
        assert ", ".join(e.categories) in evolutions and ("kept" if e.accepted else "not kept") in evolutions
        assert f'<td class="num">{len(e.added)}</td>' in evolutions
    else:
        assert 'id="policy-evolutions"' not in html
    api = client.get(f"/api/runs/{rid}").json()
    assert api["run"]["kind"] == "policy" and api["policy"]["checkpoints"][-1]["step"] == 4


def test_a_policy_runs_other_pages_do_not_break(world):
    client, _store = world
    skill = client.get("/runs/grpo/skill", follow_redirects=False)
    assert skill.status_code == 303 and skill.headers["location"] == "/runs/grpo/bank"  # its bank, evolved
    for path in ("/runs/grpo/bank", "/runs/sft/lineage", "/runs/grpo/lineage"):
        assert client.get(path).status_code == 200, path
    step = client.get("/runs/grpo/steps/1")  # a policy run has no skill steps: not found, in words
    assert step.status_code == 404 and "beyond the end" in step.text
    compare = client.get("/compare?a=bank&b=grpo")
    assert compare.status_code == 404 and "is a policy training run" in compare.text
