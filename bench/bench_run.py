"""Benchmark: a default sim run, then replay, verify and audit of it.

Run on demand:  python bench/bench_run.py [--db-dir DIR] [--all-features]
(--all-features: slow update, meta skill and the autonomous learning rate on)
Prints wall time per phase and the process's peak resident memory. Results
depend on the machine; docs/benchmarks.md records one measurement.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from skillstate import SkillConfig, Trainer
from skillstate.reading.audit import audit, verify
from skillstate.reading.history import replay


def timed(label: str, fn):
    start = time.perf_counter()
    out = fn()
    print(f"{label:28} {time.perf_counter() - start:7.2f} s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db-dir", default=None)
    parser.add_argument("--all-features", action="store_true")
    args = parser.parse_args()
    features = dict(use_slow_update=True, use_meta_skill=True, lr_control="autonomous") if args.all_features else {}
    directory = Path(args.db_dir or tempfile.mkdtemp())
    db = directory / "bench.db"
    db.unlink(missing_ok=True)
    trainer = Trainer(SkillConfig(**features), db=f"sqlite:///{db}", run_id="bench")
    result = timed(f"{'all-features' if features else 'default'} sim run (12 steps)", trainer.train)
    store = trainer.store
    timed("replay --to-step 6", lambda: replay(store, "bench", 6))
    timed("replay --to-step 12", lambda: replay(store, "bench", 12))
    report = timed("replay --verify", lambda: verify(store, "bench"))
    assert report.ok, report.divergence
    timed("audit", lambda: audit(store, "bench"))
    s = result.summary
    print(f"events {report.total}, LLM calls {sum(u['calls'] for u in s['usage'].values())}, "
          f"database {db.stat().st_size / 1e6:.1f} MB")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
