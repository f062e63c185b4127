"""Embeddings requests of a bank run (`bank.embedder: openai`): a stage's
retrieval texts embedded together before its rollouts, against one request
per rollout.

    python bench/bench_embeddings.py [--latencies 0.02,0.05] [--epochs 1] [--repeats 1]

Trains mode bank with embedding retrieval on the bundled sim world (seed
42) through the project's sim server, which holds back each chat completion
and each embeddings request by the latency, into a fresh SQLite database
per run. At each latency it runs, alternately: as skillstate runs (`batched`:
the texts a stage's retrievals will need and the journal lacks go out
together, 128 to a request) and with that step turned off (`per rollout`:
each rollout asks for its own query and skills, one request at a time, as
before 2026-11-28). It prints the wall time of the training call, the
embeddings requests the server answered, the texts journaled, the chat
calls, and whether both runs wrote the same events after `RunStarted`
(which names the server's address).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_calls import write_world

from skillstate.config import SkillConfig
from skillstate.engine.loading import lineage_events
from skillstate.llm.embeddings import JournaledEmbedder
from skillstate.log.event_codec import encode_json
from skillstate.sim.server import SimServer
from skillstate.sim.world import SimWorld, bundled_splits
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

MODES = ("batched", "per rollout")


def one(mode: str, latency: float, epochs: int, data: str, work: Path) -> dict[str, Any]:
    items = [i for split in bundled_splits().values() for i in split]
    prime = JournaledEmbedder.prime
    if mode == "per rollout":
        JournaledEmbedder.prime = lambda self, texts: None  # type: ignore[method-assign]
    try:
        with SimServer(SimWorld(items), latency=latency) as server:
            endpoint = {"base_url": server.base_url}
            config = SkillConfig(mode="bank", num_epochs=epochs, seed=42, backend="openai", data=data,
                                 target={"model": "sim-target", **endpoint},
                                 optimizer={"model": "sim-optimizer", **endpoint},
                                 bank={"retrieval": "embedding", "embedder": "openai"})
            name = f"{mode.replace(' ', '-')}-{time.monotonic_ns()}.db"
            store = Store(f"sqlite:///{work / name}")
            start = time.perf_counter()
            Trainer(config, store=store, run_id="bank").train()
            wall = time.perf_counter() - start
            texts = sum(1 for c in store.read_calls("bank") if c.role == "embedder")
            events = [encode_json(s.event) for s in lineage_events(store, "bank")][1:]
            store.close()
            return {"wall": wall, "requests": server.embedding_requests, "texts": texts,
                    "chat": sum(server.calls.values()), "events": events}
    finally:
        JournaledEmbedder.prime = prime  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latencies", default="0.02,0.05")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "local")
    print(f"bank run, embedding retrieval, bundled sim world, {args.epochs} epoch(s), seed 42, "
          f"{time.strftime('%Y-%m-%d')}")
    print("| latency | embedding | wall s | embeddings requests | texts | chat calls | same events |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = write_world(work / "world")
        for latency in (float(x) for x in args.latencies.split(",")):
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for _ in range(args.repeats):
                for mode in MODES:
                    runs[mode].append(one(mode, latency, args.epochs, data, work))
            same = all(r["events"] == runs[MODES[0]][0]["events"] for rs in runs.values() for r in rs)
            for mode in MODES:
                rs = runs[mode]
                print(f"| {latency:g} s | {mode} | {statistics.median(r['wall'] for r in rs):.2f} | "
                      f"{rs[0]['requests']} | {rs[0]['texts']} | {rs[0]['chat']} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
