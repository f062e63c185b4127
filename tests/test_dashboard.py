"""The dashboard over HTTP (Starlette's test client): every page on a
database of real sim runs, what each shows, escaping, and that it never
writes. The same pages in a real browser: tests/test_dashboard_browser.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from html import unescape

import pytest
from click.testing import CliRunner
from conftest import PG_ENV, drop_pg_schemas, new_pg_schema, small_config
from starlette.testclient import TestClient

from skillstate.cli.main import cli
from skillstate.dashboard.app import create_app
from skillstate.dashboard.store_view import RunCache, open_read_only
from skillstate.engine.loading import load_run
from skillstate.reading.provenance import explain
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

PAYLOAD_SCRIPT = "<script>window.__pwned = 1</script>"
PAYLOAD_IMG = '<img src=x onerror="window.__pwned = 2">'


def hostile_skill(tmp_path) -> str:
    path = tmp_path / "hostile.md"
    path.write_text(f"# Question answering\n\nYou answer short questions. {PAYLOAD_SCRIPT}\n\n## Rules\n"
                    f"- Think about what the user really wants. {PAYLOAD_IMG}\n", encoding="utf-8")
    return str(path)


def build_runs(store: Store, tmp_path) -> None:
    """A finished run, a fork of it, a skill-bank run and a run whose skill holds HTML payloads."""
    Trainer(small_config(), store=store, run_id="base").train()
    Trainer(store=store, run_id="base").fork(3, {"lr_scheduler": "linear"}, "fork").train()
    Trainer(small_config(num_epochs=1, mode="bank"), store=store, run_id="bank").train()
    Trainer(small_config(num_epochs=1, initial_skill=hostile_skill(tmp_path)), store=store, run_id="xss").train()


def runs_database(tmp) -> str:
    """A SQLite database in `tmp` holding `build_runs`' runs; its URL."""
    url = f"sqlite:///{tmp / 'runs.db'}"
    store = Store(url)
    build_runs(store, tmp)
    store.close()
    return url


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash")
    return runs_database(tmp), tmp / "runs.db"


@pytest.fixture(scope="module")
def client(db):
    store = open_read_only(db[0])
    with TestClient(create_app(store, allowed_hosts=["testserver", "127.0.0.1"])) as c:
        yield c
    store.close()


def embedded(html: str, element_id: str):
    match = re.search(rf'<script type="application/json" id="{element_id}"[^>]*>(.*?)</script>', html, re.S)
    assert match, element_id
    return json.loads(match.group(1))


def every_page(client) -> list[str]:
    urls = ["/", "/compare", "/compare?a=base&b=fork", "/runs/bank/bank", "/runs/bank/skill"]
    for rid in ("base", "fork", "xss"):
        urls += [f"/runs/{rid}", f"/runs/{rid}/skill", f"/runs/{rid}/skill?which=initial", f"/runs/{rid}/lineage"]
    urls += [f"/runs/base/steps/{n}" for n in range(1, 7)] + [f"/runs/xss/steps/{n}" for n in range(1, 4)]
    return urls


def test_every_page_answers(client):
    for url in every_page(client):
        r = client.get(url)
        assert r.status_code == 200, (url, r.text[:300])


def test_the_runs_page_lists_every_run(client):
    html = client.get("/").text
    for rid in ("base", "fork", "bank", "xss"):
        assert f'href="/runs/{rid}"' in html
    assert "completed" in html
    rows = client.get("/api/runs").json()
    assert {r["run_id"] for r in rows} == {"base", "fork", "bank", "xss"}
    fork = next(r for r in rows if r["run_id"] == "fork")
    assert fork["parent_run_id"] == "base" and fork["fork_step"] == 3


def test_the_run_page_curves_match_the_log(client, db):
    store = Store(db[0])
    state = load_run(store, "base").state
    store.close()
    html = client.get("/runs/base").text
    curves = embedded(html, "run-data")
    assert [s["step"] for s in curves["steps"]] == [r.step for r in state.history]
    assert [s["decision"] for s in curves["steps"]] == [r.decision for r in state.history]
    assert [s["best_score"] for s in curves["steps"]] == [r.best_score for r in state.history]
    assert curves["baseline"]["gate"] == state.baseline.gate
    assert curves["best_score"] == state.best_score
    assert set(curves["tests"]) == {"baseline", "best"}
    # the cost per stage of the run's own events
    assert set(embedded(html, "stage-data")) >= {"rollout", "reflect", "gate"}
    # one table row per step, each linking to its page
    for rec in state.history:
        assert f'href="/runs/base/steps/{rec.step}"' in html


def test_a_fork_marks_the_steps_it_inherited(client):
    curves = embedded(client.get("/runs/fork").text, "run-data")
    assert [s["inherited"] for s in curves["steps"]] == [s["step"] <= 3 for s in curves["steps"]]
    assert curves["fork_step"] == 3


def test_the_step_page_shows_patches_diff_and_decision(client, db):
    store = Store(db[0])
    loaded = load_run(store, "base")
    events = {s.event.type: s.event for s in loaded.lineage if s.step == 1}
    base_skill, candidate = store.get_blob(events["CandidateBuilt"].base_skill), store.get_blob(
        events["CandidateBuilt"].skill)
    store.close()
    html = unescape(client.get("/runs/base/steps/1").text)
    gate = events["GateDecided"]
    assert gate.reason in html and "Gate:" in html
    for patch in (e for s in loaded.lineage if s.step == 1 for e in [s.event] if e.type == "PatchProposed"):
        for edit in patch.edits:
            assert edit.content in html
    added = [line for line in candidate.splitlines() if line not in base_skill.splitlines()]
    assert added, "the first step of the sim run adds lines"
    diff = re.search(r'<div class="diff">(.*?)</div>\s*</section>', html, re.S).group(1)
    for line in added:
        assert line in diff


def test_an_early_reject_shows_its_bound(client, db):
    store = Store(db[0])
    loaded = load_run(store, "base")
    store.close()
    early = [s.event for s in loaded.lineage if s.type == "CandidateEvaluated" and s.event.partial is not None]
    assert early, "the small sim run rejects at least one candidate early"
    ev = early[0]
    html = client.get(f"/runs/base/steps/{ev.step}").text
    assert "Rejected early" in html
    assert f"{ev.partial.upper_bound:.4f}" in html and f"{ev.partial.scored} of {ev.partial.of}" in html


def test_the_skill_page_offers_each_sentence_and_why_answers_like_the_cli(client, db):
    html = client.get("/runs/base/skill").text
    sentences = [unescape(s) for s in re.findall(r'class="sentence" tabindex="0" data-text="([^"]*)"', html)]
    store = Store(db[0])
    best = store.get_blob(load_run(store, "base").state.best_skill)
    added = next(line.strip() for line in best.splitlines() if line.strip().startswith("- ")
                 and explain(store, "base", line.strip())["changes"])
    want = explain(store, "base", added)
    store.close()
    assert added in sentences or any(s in added for s in sentences)
    got = client.get("/api/runs/base/why", params={"text": added}).json()
    assert got["changes"] == want["changes"] and got["origin"]["step"] == want["origin"]["step"]
    assert client.get("/api/runs/base/why", params={"text": ""}).status_code == 404


def test_lineage_names_the_fork_step_and_overrides(client):
    html = unescape(client.get("/runs/fork/lineage").text)
    assert 'href="/runs/base"' in html and 'href="/runs/fork"' in html
    assert "fork at step 3" in html and 'lr_scheduler="linear"' in html
    assert len(re.findall(r'class="node( here)?"', client.get("/runs/base/lineage").text)) == 2


def test_compare_overlays_two_runs_and_diffs_their_best_skills(client):
    html = client.get("/compare?a=base&b=xss").text
    runs = embedded(html, "compare-data")
    assert [r["run_id"] for r in runs] == ["base", "xss"]
    assert 'class="dl add"' in html or 'class="dl del"' in html
    assert "<select" in client.get("/compare").text


def test_the_bank_page_groups_skills_and_shows_growth(client, db):
    store = Store(db[0])
    from skillstate.bank.document import read_bank

    bank = read_bank(store.get_blob(load_run(store, "bank").state.best_skill))
    store.close()
    html = unescape(client.get("/runs/bank/bank").text)
    for skill in bank.skills:
        assert skill.title in html
    growth = embedded(client.get("/runs/bank/bank").text, "growth-data")
    assert growth[0]["step"] == 0 and len(growth) == 1 + 3
    assert client.get("/runs/bank/skill", follow_redirects=False).status_code == 303


def test_model_text_is_escaped_everywhere(client):
    for url in every_page(client):
        html = client.get(url).text
        assert "<script>window.__pwned" not in html, url
        assert "<img src=x onerror" not in html, url
        assert 'onerror="window' not in html, url
    html = client.get("/runs/xss/skill?which=initial").text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html
    r = client.get("/api/runs/xss/why", params={"text": PAYLOAD_IMG})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")


def test_security_headers_and_host_check(client):
    r = client.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/", headers={"host": "attacker.example"}).status_code == 400


def test_errors_are_one_line_pages(client):
    r = client.get("/runs/nope")
    assert r.status_code == 404 and "unknown run &#39;nope&#39;" in r.text
    assert client.get("/runs/base/steps/99").status_code == 404
    assert client.get("/runs/base/steps/x").status_code == 404
    assert client.get("/api/runs/nope").json()["error"]


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_it_never_writes(client, db):
    url, path = db
    before = _digest(path)
    for page in every_page(client):
        client.get(page)
    for method in (client.post, client.put, client.delete):
        assert method("/runs/base").status_code == 405
    assert _digest(path) == before
    store = open_read_only(url)
    try:
        with pytest.raises(Exception, match="readonly|read-only|attempt to write"):
            store.put_blob("written by the dashboard")
    finally:
        store.close()


def run_one_step(store: Store, run_id: str, tmp_path):
    """Train `run_id` for one step and stop it there (a stop file); returns the config that resumes it."""
    stop = tmp_path / "STOP"
    config = small_config(stop_file=str(stop))

    def stop_after_step_1(p):
        if p.kind == "event" and p.event.type == "GateDecided":
            stop.touch()

    Trainer(config, store=store, run_id=run_id, on_progress=stop_after_step_1).train()
    stop.unlink()
    return config


def test_live_version_changes_when_a_run_grows(tmp_path):
    url = f"sqlite:///{tmp_path / 'live.db'}"
    writer = Store(url)
    config = run_one_step(writer, "grow", tmp_path)
    reader = open_read_only(url)
    cache = RunCache(reader)
    with TestClient(create_app(reader)) as c:
        v1 = c.get("/api/version", params={"runs": "grow"}).json()["version"]
        all1 = c.get("/api/version").json()["version"]
        steps1 = len(embedded(c.get("/runs/grow").text, "run-data")["steps"])
        first = cache.get("grow")
        Trainer(config, store=writer, run_id="grow").train()
        assert c.get("/api/version", params={"runs": "grow"}).json()["version"] != v1
        assert c.get("/api/version").json()["version"] != all1
        steps2 = len(embedded(c.get("/runs/grow").text, "run-data")["steps"])
    assert steps2 > steps1
    # the cache folded only the new events, and got the same state as a full load
    grown = cache.get("grow")
    assert grown.log_position[0] > first.log_position[0]
    assert grown.state == load_run(writer, "grow").state
    reader.close()
    writer.close()


def test_the_command_refuses_a_missing_database_and_warns_off_loopback(tmp_path):
    r = CliRunner().invoke(cli, ["dashboard", "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    url = f"sqlite:///{tmp_path / 'one.db'}"
    Trainer(small_config(num_epochs=1), db=url, run_id="one").prepare()
    proc = subprocess.Popen([sys.executable, "-m", "skillstate.cli.main", "dashboard", "--db", url,
                             "--host", "0.0.0.0", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert re.match(r"dashboard of .* at http://0\.0\.0\.0:\d+/", line), line
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "no authentication" in err


@pytest.mark.skipif(not os.environ.get(PG_ENV), reason=f"{PG_ENV} is not set")
def test_on_postgresql_it_reads_and_cannot_write(tmp_path):
    base = os.environ[PG_ENV]
    schema, url = new_pg_schema(base)
    try:
        writer = Store(url)
        build = Trainer(small_config(num_epochs=1), store=writer, run_id="pg")
        build.train()
        writer.close()
        store = open_read_only(url)
        with TestClient(create_app(store)) as c:
            assert c.get("/runs/pg").status_code == 200
            assert c.get("/runs/pg/steps/1").status_code == 200
        with pytest.raises(Exception, match="read-only transaction"):
            store.put_blob("written by the dashboard")
        store.close()
    finally:
        drop_pg_schemas(base, [schema])


def test_a_run_with_no_event_yet_answers_every_page(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    writer = Store(url)
    writer.create_run("new")  # a driver has created it and not appended RunStarted yet
    writer.close()
    store = open_read_only(url)
    with TestClient(create_app(store)) as c:
        for page in ("/", "/runs/new", "/runs/new/lineage", "/compare?a=new&b=new"):
            assert c.get(page).status_code == 200, page
        for page in ("/runs/new/skill", "/runs/new/bank", "/api/runs/new/why?text=x", "/runs/new/steps/1"):
            assert c.get(page).status_code == 404, page
    store.close()
