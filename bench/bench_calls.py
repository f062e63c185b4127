"""Journaled LLM calls per second at zero latency: how fast the driver itself
goes when the model answers at once.

    python bench/bench_calls.py [--repeat 3] [--epochs 4] [--pg URL] [--concurrency 8]

Trains the default config (the bundled sim world, seed 42) into a fresh
database for each of: the in-process sim backend and the project's
`skillstate sim-server` in a process of its own (through the real `openai`
client over HTTP), each on SQLite and, with --pg (default: the local
PostgreSQL of $SKILLSTATE_TEST_PG_URL, when set), on PostgreSQL. A call is
journaled when the run sends it and records its outcome (calls the run
serves from the call table do not count). It prints, per setting, the median
wall time of the training call, the calls sent, and calls sent per second,
then the issue's goals (1,000/s in-process on SQLite, 500/s on PostgreSQL).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "skillstate.cli.main", "sim-server", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sim-server did not start")


def write_world(folder: Path) -> str:
    """The bundled sim world's splits as a dataset directory (backend openai reads its items from one)."""
    import json

    from skillstate.sim.world import bundled_splits

    folder.mkdir(parents=True, exist_ok=True)
    for name, items in bundled_splits().items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    return str(folder)


def one(backend: str, db: str, epochs: int, concurrency: int, url: str | None,
        data: str | None = None) -> tuple[float, int]:
    from skillstate.config import SkillConfig
    from skillstate.trainer import Trainer

    extra = {}
    if backend == "server":
        os.environ.setdefault("OPENAI_API_KEY", "local")
        extra = {"backend": "openai", "data": data, "target": {"model": "sim-target", "base_url": url},
                 "optimizer": {"model": "sim-optimizer", "base_url": url}}
    # llm_cache lineage: a run sends its own calls even where the database holds another run's (one PostgreSQL
    # database serves every repetition)
    config = SkillConfig(num_epochs=epochs, seed=42, concurrency=concurrency, llm_cache="lineage", **extra)
    run_id = f"calls-{uuid.uuid4().hex[:8]}"
    trainer = Trainer(config, db=db, run_id=run_id)
    start = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - start
    sent = sum(u["sent"] for u in result.summary["usage"].values())
    return wall, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--pg", default=os.environ.get("SKILLSTATE_TEST_PG_URL"),
                    help="a PostgreSQL URL (each repetition uses a fresh database's worth of run ids)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = write_world(Path(tmp) / "world")
        server, url = _server()
        try:
            stores = [("sqlite", None)] + ([("postgresql", args.pg)] if args.pg else [])
            for backend in ("sim", "server"):
                for kind, pg in stores:
                    walls, sents = [], []
                    for i in range(args.repeat):
                        db = pg or f"sqlite:///{Path(tmp) / f'{backend}-{i}.db'}"
                        wall, sent = one(backend, db, args.epochs, args.concurrency, url, data)
                        walls.append(wall)
                        sents.append(sent)
                    w, s = statistics.median(walls), statistics.median(sents)
                    rows.append((backend, kind, w, s, s / w))
                    print(f"# {backend} {kind}: walls {', '.join(f'{x:.2f}' for x in walls)}", file=sys.stderr)
        finally:
            server.kill()
    print(f"journaled calls per second at zero latency: default config, {args.epochs} epochs, concurrency "
          f"{args.concurrency}, median of {args.repeat}, {time.strftime('%Y-%m-%d')}")
    print("| backend | store | wall s | calls sent | calls/s |")
    print("|---|---|---|---|---|")
    for backend, kind, w, s, rate in rows:
        name = "in-process sim" if backend == "sim" else "sim-server (HTTP, openai client)"
        print(f"| {name} | {kind} | {w:.2f} | {s:.0f} | {rate:.0f} |")
    goals = {("sim", "sqlite"): 1000, ("sim", "postgresql"): 500}
    for (backend, kind), goal in goals.items():
        found = [r for r in rows if (r[0], r[1]) == (backend, kind)]
        if found:
            print(f"goal {backend}/{kind} >= {goal}/s: {'met' if found[0][4] >= goal else 'not met'} "
                  f"({found[0][4]:.0f}/s)")


if __name__ == "__main__":
    main()
