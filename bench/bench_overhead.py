"""Benchmark: the engine's own cost on a zero-latency sim run, and CLI start-up.

Run on demand:  python bench/bench_overhead.py [--repeat N] [--db-dir DIR] [--profile FILE] [--cli]

Trains the default config (backend sim, seed 42) into a fresh SQLite file,
with the sim backend wrapped so that the CPU time spent answering LLM
requests is known. What is left of the wall time is the engine's own work:
store inserts, call journaling, JSON and hashing, blob writes, folding the
log and validating events (the QA world's scoring, a few microseconds per
item, counts as engine too). Prints, for each repetition and their median,
the wall time, the sim's time and the engine's time per event and per LLM
call (sent or served from the call table). With --profile FILE (pyinstrument
must be installed), the first repetition is profiled and its text report
written to FILE; it sees the main thread only, where the worker threads' work
shows as waits (`py-spy record -- python bench/bench_overhead.py` samples
every thread). With --cli, also times `skillstate --help` and a `skillstate
run` argument error in fresh processes. Results depend on the machine;
docs/benchmarks.md records one measurement.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


class TimedBackend:
    """An LLMClient that forwards to another and sums the CPU time it takes."""

    def __init__(self, inner: Any, clock: dict[str, float], lock: threading.Lock):
        self.inner, self.clock, self.lock = inner, clock, lock
        self.name = inner.name

    def complete(self, request: Any) -> Any:
        start = time.thread_time()
        try:
            return self.inner.complete(request)
        finally:
            spent = time.thread_time() - start
            with self.lock:
                self.clock["sim"] += spent
                self.clock["calls"] += 1


def one_run(directory: Path, index: int, profile: str | None) -> dict[str, float]:
    from skillstate import SkillConfig, Trainer
    from skillstate.engine.runner import make_backend

    clock = {"sim": 0.0, "calls": 0}
    lock = threading.Lock()

    def factory(config: Any, env: Any, role: str) -> Any:
        return TimedBackend(make_backend(config, env, role), clock, lock)

    db = directory / f"overhead-{index}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    trainer = Trainer(SkillConfig(), db=f"sqlite:///{db}", run_id="bench", backend_factory=factory)
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = trainer.train()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if profiler is not None:
        profiler.stop()
        Path(profile).write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    events = trainer.store.last_seq("bench")
    calls = sum(u["calls"] for u in result.summary["usage"].values())
    trainer.store.close()
    engine = wall - clock["sim"]
    return {"wall": wall, "cpu": cpu, "sim": clock["sim"], "sent": clock["calls"], "events": events,
            "calls": calls, "engine": engine, "per_event_ms": engine / events * 1e3,
            "per_call_ms": engine / calls * 1e3}


def time_command(args: list[str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db-dir", default=None)
    parser.add_argument("--profile", metavar="FILE", default=None)
    parser.add_argument("--cli", action="store_true", help="also time `skillstate --help` and an argument error")
    args = parser.parse_args()
    directory = Path(args.db_dir or tempfile.mkdtemp())
    rows = []
    print(f"{'run':>4} {'wall s':>7} {'cpu s':>6} {'sim s':>6} {'engine s':>8} {'events':>6} {'calls':>6} "
          f"{'sent':>5} {'ms/event':>8} {'ms/call':>7}")
    for i in range(args.repeat):
        r = one_run(directory, i, args.profile if i == 0 else None)
        rows.append(r)
        print(f"{i + 1:>4} {r['wall']:7.2f} {r['cpu']:6.2f} {r['sim']:6.2f} {r['engine']:8.2f} {r['events']:6d} "
              f"{r['calls']:6d} {r['sent']:5d} {r['per_event_ms']:8.2f} {r['per_call_ms']:7.3f}")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"{'med':>4} {med['wall']:7.2f} {med['cpu']:6.2f} {med['sim']:6.2f} {med['engine']:8.2f} "
          f"{int(med['events']):6d} {int(med['calls']):6d} {int(med['sent']):5d} {med['per_event_ms']:8.2f} "
          f"{med['per_call_ms']:7.3f}")
    if args.cli:
        script = Path(sys.executable).parent / "skillstate"  # the installed entry point, not a shim
        exe = [str(script)] if script.exists() else [sys.executable, "-m", "skillstate.cli.main"]
        for label, argv in (("skillstate --help", ["--help"]), ("skillstate run --epochs x", ["run", "--epochs", "x"])):
            times = time_command(exe + argv, 5)
            print(f"{label:28} median {statistics.median(times):.3f} s (min {min(times):.3f}, 5 runs)")


if __name__ == "__main__":
    main()
