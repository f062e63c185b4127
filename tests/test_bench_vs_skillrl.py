"""bench/vs_skillrl.py end to end in its smoke mode (needs the bench extra,
skillrl==1.0.0; skipped without it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "vs_skillrl.py"


@pytest.mark.slow
def test_smoke_benchmark_prints_both_programs_and_their_ratio(tmp_path):
    pytest.importorskip("skillrl", reason="the bench extra (skillrl==1.0.0) is not installed")
    out = tmp_path / "runs.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--latencies", "0,0.05", "--json", str(out),
                           "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    for latency in ("0", "0.05"):
        programs = [row[2] for row in rows if len(row) > 3 and row[:2] == [latency, "s"]]
        assert programs == ["skillstate", "skillrl", "skillstate/skillrl"], proc.stdout
    assert any(line.startswith("at 0.05 s: wall") for line in proc.stdout.splitlines())
    runs = json.loads(out.read_text())
    assert [(r["program"], r["latency"]) for r in runs] == [("skillstate", 0), ("skillrl", 0),
                                                            ("skillstate", 0.05), ("skillrl", 0.05)]
    for run in runs:
        assert run["calls"]["target"] > 0 and run["calls"]["optimizer"] > 0  # counted at the server, per role
        assert run["val_best"] >= run["val_baseline"]
    slow = [r for r in runs if r["latency"] == 0.05]
    assert all(r["wall_s"] > 0.05 * (r["calls"]["target"] + r["calls"]["optimizer"]) / 8 for r in slow)
