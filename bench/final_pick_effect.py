"""What the final selection's pick itself changed, in a seed sweep's runs.

    python bench/vs_skillrl.py --seeds 1,2,3,4,5 --set 'final_selection={enabled: true}' --work-dir W
    python bench/final_pick_effect.py W [W2 ...]

For every skillstate run in the work directories with the final selection
on, the best-on-val skill (the candidate ranked first) is scored on the
test split exactly as the run's own test evaluation scored its pick (the
same sim server world, model and data; the pick is scored again as a
check, and must match what the run logged). Prints, per world, gate rule
and carve source, the mean test of the pick and of the best on val, and at
which seeds the pick differed.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from contenders import KEY_ENV, OPTIMIZER_MODEL, TARGET_MODEL

from skillstate.config_views import validate_config
from skillstate.engine.runner import load_run
from skillstate.sim.noise import MODERATE, SimNoise
from skillstate.sim.server import SimServer
from skillstate.sim.world import SimWorld
from skillstate.storage.store import Store
from skillstate.trainer import evaluate_skill

WORLDS = {"clean": SimNoise(), "noisy": SimNoise(**MODERATE)}


def test_score(world: SimWorld, data: Path, skill: str, seed: int) -> float:
    with SimServer(world) as server, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "skill.md"
        path.write_text(skill, encoding="utf-8")
        model = {"base_url": server.base_url, "api_key_env": KEY_ENV}
        config = validate_config({"backend": "openai", "data": str(data), "initial_skill": str(path), "seed": seed,
                                  "gate_metric": "hard", "concurrency": 8, "target": {**model, "model": TARGET_MODEL},
                                  "optimizer": {**model, "model": OPTIMIZER_MODEL}})
        return evaluate_skill(config, "test", db=f"sqlite:///{tmp}/eval.db", run_id="e").state.tests["eval"].scores.hard


def one_run(db: Path) -> dict | None:
    run_dir, work = db.parent, db.parent.parent
    world_name, seed = run_dir.name.split("-")[:2]
    store = Store(f"sqlite:///{db}")
    try:
        state = load_run(store, "bench").state
        sel = state.final_selection
        if sel is None:
            return None
        items = [json.loads(line) for name in ("train", "val", "test")
                 for line in (work / "data" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]
        world = SimWorld(items, WORLDS[world_name])
        tests = {rank: test_score(world, work / "data", store.get_blob(sel.candidates[rank].skill), int(seed))
                 for rank in sorted({0, sel.chosen})}
        logged = state.tests["best"].scores.hard
        if tests[sel.chosen] != logged:
            sys.exit(f"{db}: the pick scores {tests[sel.chosen]} on test, the run logged {logged}")
        return {"world": world_name, "seed": int(seed), "gate_rule": state.config.get("gate_rule", "strict"),
                "carve_from": state.config["final_selection"].get("carve_from"), "chosen": sel.chosen,
                "best_val": sel.best_val, "best_on_val_test": tests[0], "pick_test": tests[sel.chosen],
                "pick_selection": sel.selection_score}
    finally:
        store.close()


def main() -> None:
    os.environ.setdefault(KEY_ENV, "local")
    rows = [r for work in sys.argv[1:] for db in sorted(Path(work).glob("*-skillstate-*/skillstate.db"))
            if (r := one_run(db)) is not None]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["world"], r["gate_rule"], r["carve_from"]), []).append(r)
    for (world, rule, source), rs in sorted(groups.items()):
        mean = statistics.mean
        pick, first = mean(r["pick_test"] for r in rs), mean(r["best_on_val_test"] for r in rs)
        print(f"{world} gate_rule {rule}, carved from {source}, {len(rs)} seeds: test of the pick {pick:.3f}, of "
              f"the best on val {first:.3f} ({pick - first:+.3f}); the pick differed at seeds "
              f"{[r['seed'] for r in rs if r['chosen']] or 'none'}; gap best val - pick test "
              f"{mean(r['best_val'] - r['pick_test'] for r in rs):+.3f}, best val - best-on-val test "
              f"{mean(r['best_val'] - r['best_on_val_test'] for r in rs):+.3f}, the pick's selection - test "
              f"{mean(r['pick_selection'] - r['pick_test'] for r in rs):+.3f}")


if __name__ == "__main__":
    main()
