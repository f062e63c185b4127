"""The dashboard in a real browser: Debian's chromium driven by playwright,
against `skillstate dashboard` started as a user would start it, on a
database of real sim runs. Slow suite (SKILLSTATE_SLOW=1; .ci/run installs
chromium with apt and the `browser` extra)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import small_config
from test_dashboard import PAYLOAD_IMG, PAYLOAD_SCRIPT, run_one_step, runs_database

from skillstate.engine.loading import load_run
from skillstate.reading.provenance import explain
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("SKILLSTATE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Set to a folder to keep the screenshots (docs/dashboard.md's, docs/dashboard-*.jpg, come from here).
SHOTS = os.environ.get("SKILLSTATE_SCREENSHOTS")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DECISION_SETS = ("accepted", "new best", "rejected", "rejected early (bound)", "skipped")


class Dashboard:
    """`skillstate dashboard --port 0` in a subprocess; its URL from its first line."""

    def __init__(self, db: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "skillstate.cli.main", "dashboard", "--db", db,
                                      "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stdout.readline()
        match = re.search(r"at (http://\S+?)/ ", line)
        if not match:
            self.close()
            raise AssertionError(f"the dashboard did not start: {line!r} {self.proc.stderr.read()!r}")
        self.url = match.group(1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=10)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: install Debian's chromium package (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    url = runs_database(tmp_path_factory.mktemp("dash-browser"))
    server = Dashboard(url)
    yield server, url
    server.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.problems = []  # console errors (a CSP violation is one) and uncaught exceptions
    pg.on("console", lambda m: pg.problems.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.problems.append(str(e)))
    yield pg
    context.close()


def shot(pg, name: str, tmp_path, full: bool = True) -> Path:
    path = Path(SHOTS or tmp_path) / f"dashboard-{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(path), full_page=full)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


def datasets(pg, chart_id: str) -> list[dict]:
    return pg.evaluate("""(id) => Chart.getChart(id).data.datasets.map(
        (d) => ({label: d.label, points: d.data.length, data: d.data}))""", chart_id)


def test_every_page_renders_in_chromium_without_errors(site, page, tmp_path):
    server, _ = site
    pages = {"runs": "/", "run": "/runs/base", "step": "/runs/base/steps/2", "skill": "/runs/base/skill",
             "lineage": "/runs/fork/lineage", "compare": "/compare?a=base&b=fork", "bank": "/runs/bank/bank",
             "fork": "/runs/fork"}
    for name, path in pages.items():
        page.goto(server.url + path)
        page.wait_for_load_state("networkidle")
        shot(page, name, tmp_path, full=name not in ("run", "fork"))
    assert page.problems == []


def test_the_curves_have_one_point_per_step(site, page):
    server, url = site
    store = Store(url)
    state = load_run(store, "base").state
    store.close()
    page.goto(server.url + "/runs/base")
    page.wait_for_function("() => window.Chart && Chart.getChart('curve-chart')")
    sets = {d["label"]: d for d in datasets(page, "curve-chart")}
    assert sum(sets[label]["points"] for label in DECISION_SETS if label in sets) == len(state.history)
    assert sets["current"]["points"] == len(state.history) + 1  # from the baseline on
    assert sets["best"]["data"][-1]["y"] == pytest.approx(state.best_score)
    assert sets["rejected"]["points"] + sets.get("rejected early (bound)", {"points": 0})["points"] == state.count(
        "reject")
    assert sets["test (end)"]["points"] == 2
    budget = datasets(page, "budget-chart")[0]
    assert budget["points"] == len(state.history)
    rows = page.locator("#steps-table tbody tr")
    assert rows.count() == len(state.history) + 1  # the baseline's row, then one per step
    assert page.locator("#steps-table tbody tr.baseline-row").count() == 1
    assert page.problems == []


def test_a_fork_draws_its_parents_steps_apart(site, page):
    server, _ = site
    page.goto(server.url + "/runs/fork")
    page.wait_for_function("() => window.Chart && Chart.getChart('curve-chart')")
    sets = {d["label"]: d for d in datasets(page, "curve-chart")}
    assert sets["parent's steps"]["points"] == 3
    assert sum(sets[label]["points"] for label in DECISION_SETS if label in sets) == 3  # steps 4 to 6


def test_the_step_diff_shows_the_added_lines(site, page):
    server, url = site
    store = Store(url)
    built = next(s.event for s in load_run(store, "base").lineage if s.type == "CandidateBuilt" and s.step == 1)
    before, after = store.get_blob(built.base_skill).splitlines(), store.get_blob(built.skill).splitlines()
    store.close()
    page.goto(server.url + "/runs/base/steps/1")
    added = page.locator("#diff .dl.add .txt").all_inner_texts()
    assert added == [line for line in after if line not in before]
    assert page.locator("#decision").inner_text().startswith("Gate:")


def test_clicking_a_sentence_shows_its_provenance(site, page):
    server, url = site
    store = Store(url)
    best = store.get_blob(load_run(store, "base").state.best_skill)
    line = next(x.strip() for x in best.splitlines()
                if x.strip().startswith("- ") and explain(store, "base", x.strip())["changes"])
    info = explain(store, "base", line)
    store.close()
    page.goto(server.url + "/runs/base/skill")
    page.locator(".sentence", has_text=line[2:40]).first.click()
    body = page.locator("#why-body")
    body.locator(".why-section").first.wait_for()
    text = body.inner_text()
    step = info["changes"][-1]["step"]
    assert f"at step {step}" in text and "added" in text
    for edit in info["origin"]["kept_edits"]:
        assert edit["content"] in text
    link = body.locator(f'a[href="/runs/base/steps/{step}"]').first
    link.click()
    page.wait_for_url(f"**/runs/base/steps/{step}")
    assert page.problems == []


def test_lineage_nodes_open_their_run(site, page):
    server, _ = site
    page.goto(server.url + "/runs/base/lineage")
    page.locator(".node a.runlink", has_text="fork").click()
    page.wait_for_url("**/runs/fork")
    assert "fork" in page.locator(".runbar-id").inner_text()


def test_compare_overlays_both_curves(site, page):
    server, _ = site
    page.goto(server.url + "/compare?a=base&b=xss")
    page.wait_for_function("() => window.Chart && Chart.getChart('compare-chart')")
    labels = [d["label"] for d in datasets(page, "compare-chart")]
    assert any(label.startswith("A base") for label in labels) and any(label.startswith("B xss") for label in labels)
    assert page.locator("#compare-diff .dl").count() > 0


def test_hostile_skill_text_renders_as_text_and_runs_nothing(site, page, tmp_path):
    server, _ = site
    for path in ("/runs/xss/skill?which=initial", "/runs/xss/skill?which=current", "/runs/xss/steps/1",
                 "/compare?a=base&b=xss", "/runs/xss"):
        page.goto(server.url + path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("() => window.__pwned") is None, path
        assert page.locator("img[src='x']").count() == 0, path
    page.goto(server.url + "/runs/xss/skill?which=initial")
    doc = page.locator("#skill-doc").inner_text()
    assert PAYLOAD_SCRIPT in doc and PAYLOAD_IMG in doc
    page.locator(".sentence", has_text="onerror").first.click()
    page.locator("#why-body .why-quote").wait_for()
    page.wait_for_timeout(300)
    assert PAYLOAD_IMG in page.locator("#why-body").inner_text()
    assert page.evaluate("() => window.__pwned") is None
    shot(page, "hostile", tmp_path)
    # the one problem allowed: none (a blocked inline script would show as a CSP error)
    assert page.problems == []


def test_a_run_in_progress_updates_the_page_without_a_reload(browser, tmp_path):
    url = f"sqlite:///{tmp_path / 'live.db'}"
    writer = Store(url)
    config = run_one_step(writer, "live", tmp_path)
    server = Dashboard(url)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    try:
        pg.goto(server.url + "/runs/live")
        pg.wait_for_function("() => window.Chart && Chart.getChart('curve-chart')")
        assert pg.locator("#steps-table tbody tr:not(.baseline-row)").count() == 1
        pg.evaluate("() => { window.__same_page = 42; }")
        runs_page = context.new_page()
        runs_page.goto(server.url + "/")
        runs_page.evaluate("() => { window.__same_page = 7; }")

        def slowly(p):
            if p.kind == "event":
                time.sleep(0.05)

        resume = threading.Thread(target=lambda: Trainer(config, store=writer, run_id="live",
                                                         on_progress=slowly).train())
        resume.start()
        pg.wait_for_function("() => document.querySelectorAll('#steps-table tbody tr:not(.baseline-row)').length >= 3",
                             timeout=30_000)
        assert pg.evaluate("() => window.__same_page") == 42  # updated in place, not reloaded
        points = pg.evaluate("() => Chart.getChart('curve-chart').data.datasets"
                             ".find((d) => d.label === 'current').data.length")
        assert points >= 3  # the baseline and steps 1 and 2 (step 3 has started: its row says "in progress")
        resume.join()
        Trainer(small_config(num_epochs=1), store=writer, run_id="second").train()
        runs_page.wait_for_function("() => !!document.querySelector('a[href=\"/runs/second\"]')", timeout=15_000)
        assert runs_page.evaluate("() => window.__same_page") == 7
        pg.wait_for_function("() => /completed/.test(document.getElementById('status-badge').textContent)",
                             timeout=15_000)
    finally:
        context.close()
        server.close()
        writer.close()
