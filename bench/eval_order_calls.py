"""How many calls early reject spends in each val order, for the same decisions.

    python bench/eval_order_calls.py [--seeds 1,2,...] [--worlds clean,noisy] [--epochs 2] [--json FILE]

For each world (`clean`: the bundled sim world; `noisy`: the sim's noisy
mode at its moderate levels) and seed, it trains the default config three
times, each into a fresh SQLite database, with `eval_order` split (the val
split's own order), failed_first (the default: the items the current skill
failed first) and hardness. Early reject's decision never depends on the
order, but two settings would let the order reach later prompts, so both
are off in all three runs: the step buffer (which shows a rejected step's
score bound) and the repair's `repair_prefix` (which pairs the items early
reject scored). The three runs must then make the same decisions: the
script checks every gate decision and the skill each step ends with, and
exits 1 if any differ.

It prints, per world and order, the target calls sent, the val items that
candidate and slow-update evaluations scored, and the early rejects; then
each order against split order, per seed and in total.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
from pathlib import Path

from skillstate.config import SkillConfig
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

ORDERS = ("split", "failed_first", "hardness")
WORLDS = {"clean": {}, "noisy": {"sim": {"noise": "moderate"}}}


def one_run(world: str, seed: int, order: str, epochs: int, folder: Path) -> dict:
    config = SkillConfig(**WORLDS[world], seed=seed, num_epochs=epochs, eval_order=order, use_step_buffer=False,
                         repair_prefix=False)
    store = Store(f"sqlite:///{folder / f'{world}-{seed}-{order}.db'}")
    try:
        result = Trainer(config, store=store, run_id="r").train()
        decisions, scored, rejects = [], 0, 0
        for stored in store.read_events("r"):
            event = stored.event
            if event.type == "GateDecided":
                decisions.append((event.step, event.decision))
            elif event.type == "CandidateBuilt":
                decisions.append((event.step, event.base_skill, event.skill))
            elif event.type == "SlowUpdateDecided":
                decisions.append((event.epoch, event.decision))
            partial = getattr(event, "partial", None)
            if event.type in ("CandidateEvaluated", "SlowUpdateDecided") and getattr(event, "scores", None):
                if partial is not None:
                    scored += partial.scored
                    rejects += 1
                elif event.type == "CandidateEvaluated":
                    scored += event.scores.n
        target = result.summary["usage"]["target"]
        return {"world": world, "seed": seed, "order": order, "target_sent": target["sent"],
                "val_scored": scored, "early_rejects": rejects, "decisions": decisions,
                "test": (result.summary.get("val_to_test") or {}).get("test")}
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--worlds", default="clean,noisy")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    worlds = args.worlds.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in worlds:
            for seed in seeds:
                for order in ORDERS:
                    rows.append(one_run(world, seed, order, args.epochs, Path(tmp)))
    same = True
    for world in worlds:
        for seed in seeds:
            runs = [r for r in rows if r["world"] == world and r["seed"] == seed]
            if any(r["decisions"] != runs[0]["decisions"] for r in runs):
                print(f"DECISIONS DIFFER: {world} seed {seed}", file=sys.stderr)
                same = False
    print(f"early reject's calls by val order: default config, {args.epochs} epochs, seeds {args.seeds}, "
          f"{dt.date.today()}")
    print("| world | order | target calls (mean) | val items scored (mean) | early rejects (mean) | "
          "calls vs split (total) | seeds with fewer / more calls than split |")
    print("|---|---|---|---|---|---|---|")
    for world in worlds:
        base = {r["seed"]: r for r in rows if r["world"] == world and r["order"] == "split"}
        for order in ORDERS:
            mine = [r for r in rows if r["world"] == world and r["order"] == order]
            total, total_base = sum(r["target_sent"] for r in mine), sum(base[r["seed"]]["target_sent"] for r in mine)
            fewer = sum(r["target_sent"] < base[r["seed"]]["target_sent"] for r in mine)
            more = sum(r["target_sent"] > base[r["seed"]]["target_sent"] for r in mine)
            print(f"| {world} | {order} | {statistics.mean(r['target_sent'] for r in mine):.1f} | "
                  f"{statistics.mean(r['val_scored'] for r in mine):.1f} | "
                  f"{statistics.mean(r['early_rejects'] for r in mine):.2f} | "
                  f"{total - total_base:+d} ({(total - total_base) / total_base:+.1%}) | {fewer} / {more} |")
    print("decisions identical in every order: " + ("yes" if same else "NO"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
