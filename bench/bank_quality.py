"""How well the skill bank (mode bank) learns: val and test, where the
current bank ends, and how often retrieval finds anything.

    python bench/bank_quality.py [--worlds qa,qa-noisy,rooms] [--retrieval template,embedding]
                                 [--seeds 42,7] [--set KEY=VALUE ...] [--json FILE]

Each (world, retrieval, seed) trains on the sim backend into a fresh SQLite
database: `qa` is the bundled sim world, `qa-noisy` the same with
`sim.noise: moderate`, `rooms` the multi-turn example of
examples/custom_episode. It prints, per world and retrieval, the means over
the seeds of: val at the baseline, of the best bank and of the current bank
at the end; test of the initial and the best bank; the retrieval hit rate
(the share of training rollouts whose task was given at least one skill,
counted over rollouts where the bank held any skill) and the calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORLDS = {
    "qa": {"env": "qa"},
    "qa-noisy": {"env": "qa", "sim": {"noise": "moderate"}},
    "rooms": {"env": "python:rooms_env:RoomsEnv", "env_config": {"size": 3, "closed_doors": 0.5},
              "episode": {"max_turns": 20}, "batch_size": 10, "minibatch_size": 5},
}


def _set(data: dict, key: str, value: str) -> None:
    import yaml

    *path, last = key.split(".")
    for part in path:
        data = data.setdefault(part, {})
    data[last] = yaml.safe_load(value)


def train(world: str, retrieval: str, seed: int, epochs: int | None, extra: list[str], work: Path) -> dict:
    from skillstate.bank.document import read_bank
    from skillstate.config_views import validate_config
    from skillstate.log.reducer import RunState, reduce
    from skillstate.storage.store import Store
    from skillstate.trainer import Trainer

    data = json.loads(json.dumps(WORLDS[world]))
    data.update(mode="bank", seed=seed)
    if epochs is not None:
        data["num_epochs"] = epochs
    data.setdefault("bank", {})["retrieval"] = retrieval
    for item in extra:
        key, _, value = item.partition("=")
        _set(data, key, value)
    db = f"sqlite:///{work / f'{world}-{retrieval}-{seed}.db'}"
    run_id = f"{world}-{retrieval}-{seed}"
    start = time.perf_counter()
    result = Trainer(validate_config(data), db=db, run_id=run_id).train()
    wall = time.perf_counter() - start
    s = result.summary
    store = Store(db)
    hits = total = 0
    state = RunState()
    for stored in store.read_events(run_id):
        event = stored.event
        if event.type == "RolloutCompleted" and read_bank(store.get_blob(state.progress.base_skill)).skills:
            for r in event.results:
                total += 1
                hits += bool(r.retrieved)
        state = reduce(state, event)
    store.close()
    state = result.state
    return {"world": world, "retrieval": retrieval, "seed": seed, "wall": wall,
            "calls": {role: u["calls"] for role, u in s["usage"].items()},
            "val_base": s["baseline_score"], "val_best": s["best_score"], "val_current": state.current_score,
            "test_base": s["test"]["baseline"]["hard"], "test_best": s["test"]["best"]["hard"],
            "hit_rate": hits / total if total else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="qa,qa-noisy,rooms")
    ap.add_argument("--retrieval", default="template,embedding")
    ap.add_argument("--seeds", default="42,7")
    ap.add_argument("--epochs", type=int, help="num_epochs (default: the config's default)")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", help="Also write every run's figures to this file.")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "examples" / "custom_episode"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.worlds.split(","):
            for retrieval in args.retrieval.split(","):
                for seed in (int(s) for s in args.seeds.split(",")):
                    r = train(world, retrieval, seed, args.epochs, args.extra, Path(tmp))
                    rows.append(r)
                    print(f"# {world} {retrieval} seed {seed}: val {r['val_base']:.3f} -> best {r['val_best']:.3f}, "
                          f"current {r['val_current']:.3f}; test {r['test_base']:.3f} -> {r['test_best']:.3f}; "
                          f"hits {r['hit_rate']:.2f}; {r['wall']:.1f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    settings = "".join(f", {e}" for e in args.extra)
    print(f"skill bank quality: {args.epochs or 'default'} epochs, seeds {args.seeds}{settings}")
    print("| world | retrieval | val base | val best | val current (end) | test base | test best | hit rate | "
          "target calls | optimizer calls |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    groups = dict.fromkeys((r["world"], r["retrieval"]) for r in rows)
    for world, retrieval in groups:
        mine = [r for r in rows if (r["world"], r["retrieval"]) == (world, retrieval)]

        def mean(key: str, rows: list[dict] = mine) -> float:
            return statistics.fmean(r[key] for r in rows)

        calls = [statistics.fmean(r["calls"].get(role, 0) for r in mine) for role in ("target", "optimizer")]
        cells = [mean(k) for k in ("val_base", "val_best", "val_current", "test_base", "test_best")]
        print(f"| {world} | {retrieval} | " + " | ".join(f"{c:.3f}" for c in cells)
              + f" | {mean('hit_rate'):.2f} | {calls[0]:.0f} | {calls[1]:.0f} |")


if __name__ == "__main__":
    main()
