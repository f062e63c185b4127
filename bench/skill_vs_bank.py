"""One skill document (SkillOpt, mode skill) against a bank of skills
(SkillRL, mode bank), on the same environment, data and schedule.

    python bench/skill_vs_bank.py [--env qa] [--epochs 2] [--seeds 42,7,2024] [--empty-start]

Both train on the sim backend from the environment's data (the bundled sim
world for qa) with the same seed, epochs and batch size; each gets a fresh
SQLite database. It prints, per seed and mode, the LLM calls per role and
the test success per category (task type) of the initial and the best skill
or bank, then the means over the seeds. With --empty-start, the skill
document starts empty, as the bank does (else from the environment's
default skill).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from skillstate.config import SkillConfig
from skillstate.trainer import Trainer


def train(mode: str, env: str, epochs: int, seed: int, work: Path, empty_start: bool = False) -> dict:
    start_from = {}
    if empty_start and mode == "skill":
        (work / "empty.md").write_text("")
        start_from = {"initial_skill": str(work / "empty.md")}
    config = SkillConfig(mode=mode, env=env, num_epochs=epochs, seed=seed, **start_from)
    start = time.perf_counter()
    result = Trainer(config, db=f"sqlite:///{work / f'{mode}-{seed}.db'}", run_id=f"{mode}-{seed}").train()
    s = result.summary
    return {"mode": mode, "seed": seed, "wall": time.perf_counter() - start,
            "calls": {role: u["calls"] for role, u in s["usage"].items()},
            "val": (s["baseline_score"], s["best_score"]),
            "before": {t: v["hard"] for t, v in s["test"]["baseline"]["by_task_type"].items()},
            "after": {t: v["hard"] for t, v in s["test"]["best"]["by_task_type"].items()},
            "test": (s["test"]["baseline"]["hard"], s["test"]["best"]["hard"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="qa")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", default="42,7,2024")
    ap.add_argument("--empty-start", action="store_true", help="The skill document starts empty, as the bank does.")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for mode in ("skill", "bank"):
                rows.append(train(mode, args.env, args.epochs, seed, Path(tmp), args.empty_start))
                r = rows[-1]
                print(f"# {mode} seed {seed}: test {r['test'][0]:.3f} -> {r['test'][1]:.3f}, calls {r['calls']}, "
                      f"{r['wall']:.1f} s", file=sys.stderr)
    categories = sorted({t for r in rows for t in r["after"]})
    start = "both start empty" if args.empty_start else "the document starts from the environment's skill"
    print(f"skill document against skill bank: env {args.env}, {args.epochs} epochs, seeds {args.seeds}; {start}")
    print("| mode | target calls | optimizer calls | val best | test before | test after | "
          + " | ".join(categories) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(categories))
    for mode in ("skill", "bank"):
        mine = [r for r in rows if r["mode"] == mode]

        def mean(values: list[float]) -> float:
            return statistics.fmean(values)

        cells = [f"{mean([r['before'].get(t, 0.0) for r in mine]):.2f} → "
                 f"{mean([r['after'].get(t, 0.0) for r in mine]):.2f}" for t in categories]
        print(f"| {mode} | {mean([r['calls'].get('target', 0) for r in mine]):.0f} | "
              f"{mean([r['calls'].get('optimizer', 0) for r in mine]):.0f} | {mean([r['val'][1] for r in mine]):.3f} | "
              f"{mean([r['test'][0] for r in mine]):.3f} | {mean([r['test'][1] for r in mine]):.3f} | "
              + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
