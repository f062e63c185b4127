"""Benchmark: how long the reading commands take in a fresh process, on a small database.

Run on demand:  python bench/bench_startup.py [--repeat N] [--db-dir DIR] [--importtime]

Makes a database with one small run (1 epoch of 3 steps, batch 12, on the sim backend), then runs
`skillstate runs`, `skillstate show RUN`, `skillstate show RUN --step 1` and `skillstate --help`, each
`--repeat` times in a new process, alternating, and prints per command the wall time and the CPU time
(user + system) of the process: the fastest and the median. On a loaded machine the wall time says more
about the load than about skillstate; the fastest CPU time is the steadier figure. With --importtime, also
prints the ten slowest imports of `skillstate runs` (`python -X importtime`, cumulative). Results depend on
the machine; docs/benchmarks.md records one measurement. (Which modules a command imports is checked by
tests/test_startup.py, not timed.)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = "from skillstate.cli.main import main; main()"


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `skillstate ARGS` in a new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", PROGRAM, *args], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def slowest_imports(args: list[str], env: dict[str, str], n: int = 10) -> list[tuple[int, str]]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", PROGRAM, *args], env=env, check=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    rows = []
    for line in out.splitlines():
        if line.startswith("import time:") and "|" in line:
            _self, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
            if cumulative.isdigit():
                rows.append((int(cumulative), name))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--db-dir", help="Where to make the database (default: a new temporary directory).")
    parser.add_argument("--importtime", action="store_true")
    opts = parser.parse_args()
    folder = Path(opts.db_dir or tempfile.mkdtemp(prefix="skillstate-startup-"))
    url = f"sqlite:///{folder / 'startup.db'}"
    env = {**os.environ, "COLUMNS": "100"}
    if not (folder / "startup.db").exists():
        subprocess.run([sys.executable, "-c", PROGRAM, "run", "--run-id", "small", "--epochs", "1", "--batch-size",
                        "12", "-q", "--db", url], env=env, check=True, stdout=subprocess.DEVNULL)
    commands = {"runs": ["runs", "--db", url], "show": ["show", "small", "--db", url],
                "show --step 1": ["show", "small", "--step", "1", "--db", url], "--help": ["--help"]}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(opts.repeat):
        for name, args in commands.items():
            times[name].append(timed(args, env))
    print(f"{'command':<15} {'wall min':>9} {'wall med':>9} {'cpu min':>8} {'cpu med':>8}   ({opts.repeat} each)")
    for name, rows in times.items():
        walls, cpus = [w for w, _ in rows], [c for _, c in rows]
        print(f"{name:<15} {min(walls):8.3f}s {statistics.median(walls):8.3f}s {min(cpus):7.3f}s "
              f"{statistics.median(cpus):7.3f}s")
    if opts.importtime:
        print("\nslowest imports of `skillstate runs` (cumulative):")
        for micros, name in slowest_imports(commands["runs"], env):
            print(f"  {micros / 1e6:6.3f}s  {name}")


if __name__ == "__main__":
    main()
