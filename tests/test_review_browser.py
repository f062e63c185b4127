"""The review page in a real browser (issue 43): `skillstate dashboard --review` started as a user starts
it, Debian's chromium driven by playwright; a run with `review: accepted` stops at its first accepted step,
is approved in the page with one edit left out, resumes to completion (each later step approved in the
page too), and passes audit and replay --verify. Slow suite (SKILLSTATE_SLOW=1), like the dashboard's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from test_dashboard_browser import CHROMIUM, CHROMIUM_ARGS, browser  # noqa: F401  (the module's browser)
from test_review import of_type, waiting_run

from skillstate.engine.loading import load_run
from skillstate.errors import ReviewPending
from skillstate.log.events_review import ReviewDecided
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

pytestmark = pytest.mark.browser


class ReviewDashboard:
    """`skillstate dashboard --review --port 0` in a subprocess; its URL from its first line."""

    def __init__(self, db: str, *extra: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "skillstate.cli.main", "dashboard", "--db", db,
                                      "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stdout.readline()
        match = re.search(r"at (http://\S+?)/ \((.*?);", line)
        if not match:
            self.close()
            raise AssertionError(f"the dashboard did not start: {line!r} {self.proc.stderr.read()!r}")
        self.url, self.mode = match.group(1), match.group(2)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=10)


@pytest.fixture
def page(browser):  # noqa: F811
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    pg = context.new_page()
    pg.problems = []
    pg.on("console", lambda m: pg.problems.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.problems.append(str(e)))
    yield pg
    context.close()


def test_a_run_is_reviewed_in_chromium_with_one_edit_left_out_and_completes(tmp_path, page):
    db = f"sqlite:///{tmp_path / 'b.db'}"
    store = Store(db)
    waiting_run(store)
    readonly = ReviewDashboard(db)
    try:
        assert readonly.mode == "read-only"
        page.goto(readonly.url + "/runs/r/review")
        assert page.locator("#review-form").count() == 0 and page.locator("#review-readonly").is_visible()
    finally:
        readonly.close()

    server = ReviewDashboard(db, "--review", "--reviewer", "alice")
    try:
        assert server.mode.startswith("review mode")
        page.goto(server.url + "/")
        page.click("a.review-link")
        page.wait_for_selector("#review-form")
        assert page.input_value("#reviewer") == "alice"
        assert page.locator("#review-diff .dl.add").count() >= 1
        assert page.locator("#review-edits li.edit").count() >= 2
        page.check("#edit-2 input[name=drop]")
        page.fill("#comment", "edit 2 is too broad")
        page.click("#approve")
        page.wait_for_selector("#recorded")
        assert "approve without edit 2 by alice" in page.inner_text("#recorded")
        assert page.inner_text("#review-reviewer") == "alice"
        (decided,) = of_type(store, "r", ReviewDecided)
        assert decided.dropped == [1] and decided.comment == "edit 2 is too broad"

        for _ in range(10):  # resume; every later accepted step is approved whole in the page
            try:
                Trainer(store=store, run_id="r").train()
                break
            except ReviewPending:
                page.goto(server.url + "/runs/r/review")
                page.wait_for_selector("#review-form")
                page.click("#approve")
                page.wait_for_selector("#recorded")
        assert load_run(store, "r").state.completed
        page.goto(server.url + "/runs/r/steps/1")
        assert "without edit 2 by alice" in page.inner_text("#step-review")
    finally:
        server.close()
    assert audit(store, "r").ok and verify(store, "r").ok
    assert all(d.reviewer == "alice" for d in of_type(store, "r", ReviewDecided))
    assert page.problems == []
    store.close()
