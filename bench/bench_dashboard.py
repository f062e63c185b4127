"""How fast the dashboard's pages load in a real browser, on the default
12-step sim run and on a long sim run (batch 4, 34 epochs: 1,020 steps).

It trains both runs into a temporary database, starts `skillstate
dashboard` as a user would, and loads each page in Debian's chromium through
playwright: the time from navigation until the page's charts are drawn (or
the page is loaded, for pages without charts). "cold" is the first load
after the server started (it folds the run's log, and for the runs page
every run's); "warm" is the median of five more loads. "(a static file)" is
the browser's own cost of a navigation, for scale.

    python bench/bench_dashboard.py [--steps-epochs 34] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skillstate.config import SkillConfig
from skillstate.engine.loading import load_run
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

PAGES = {
    "run": ("/runs/{rid}", "() => window.Chart && Chart.getChart('curve-chart')"),
    "run, every step": ("/runs/{rid}?steps=all", "() => window.Chart && Chart.getChart('curve-chart')"),
    "step": ("/runs/{rid}/steps/{mid}", None),
    "skill": ("/runs/{rid}/skill", None),
    "runs": ("/", None),
}


def train(url: str, run_id: str, **config) -> float:
    start = time.perf_counter()
    store = Store(url)
    Trainer(SkillConfig(**config), store=store, run_id=run_id).train()
    store.close()
    return time.perf_counter() - start


def start_dashboard(url: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "skillstate.cli.main", "dashboard", "--db", url, "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"at (http://\S+?)/ ", line)
    if not match:
        proc.kill()
        raise SystemExit(f"the dashboard did not start: {line!r}")
    return proc, match.group(1)


def load(page, url: str, ready: str | None) -> float:
    start = time.perf_counter()
    page.goto(url, wait_until="load")
    if ready:
        page.wait_for_function(ready)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long-epochs", type=int, default=34, help="epochs of the long run (batch 4: 30 steps each)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        t12 = train(url, "default-12")
        tlong = train(url, "long", batch_size=4, num_epochs=args.long_epochs)
        store = Store(url)
        steps = {rid: len(load_run(store, rid).state.history) for rid in ("default-12", "long")}
        events = {rid: store.last_seq(rid) for rid in steps}
        store.close()
        print(f"trained: default-12 {steps['default-12']} steps ({events['default-12']} events) in {t12:.1f} s; "
              f"long {steps['long']} steps ({events['long']} events) in {tlong:.1f} s")
        rows = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for rid in ("default-12", "long"):
                proc, base = start_dashboard(url)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    floor = statistics.median(load(page, base + "/static/chart.js-LICENSE.md", None)
                                              for _ in range(6))  # the browser's own cost of a navigation
                    rows.append((rid, "(a static file)", floor, floor, 1024))
                    for name, (path, ready) in PAGES.items():
                        target = base + path.format(rid=rid, mid=max(steps[rid] // 2, 1))
                        cold = load(page, target, ready)
                        warm = statistics.median(load(page, target, ready) for _ in range(5))
                        size = len(page.content().encode())
                        rows.append((rid, name, cold, warm, size))
                    page.close()
                finally:
                    proc.terminate()
                    proc.wait(timeout=10)
            browser.close()
    print(f"{'run':<12} {'page':<16} {'cold s':>8} {'warm s':>8} {'HTML KB':>8}")
    for rid, name, cold, warm, size in rows:
        print(f"{rid:<12} {name:<16} {cold:>8.2f} {warm:>8.2f} {size / 1024:>8.0f}")


if __name__ == "__main__":
    main()
