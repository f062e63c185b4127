"""Many seeds of one program on the sim world, scored by what the final skill is worth, not by one draw.

    pip install -e ".[bench]"
    python bench/true_accuracy.py --program skillstate --world noisy --seeds 1-20 --work-dir DIR [--set K=V ...]
                                  [--knob K=V ...]   (a sim knob of --world set otherwise: blocking=0.8)
    python bench/true_accuracy.py --compare DIR_A DIR_B    (paired by seed: mean difference, its standard error)

On the sim's noisy mode a test score of 60 items is itself a sample: 70% of
the answers are drawn again whenever the skill changes by a word, so two
skills of the same worth can score 0.1 apart. The sim knows each skill's
chance of a right answer on every item (`SimWorld.chance`, with the length
penalty and the harmful rules), so this sweep reports, beside the test
score, the final skill's *expected* test accuracy: the mean of those
chances over the test items, the score the test split would average over
infinitely many draws. The run of each seed is the same as in
`vs_skillrl.py`'s seed sweep (same data, schedule, cap, server), so its
test scores match that sweep's.

It prints one line per seed, then the mean, spread and minimum of the
expected accuracy, the mean test score and the mean calls; `results.json`
in the work directory keeps each seed's figures for `--compare`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from vs_skillrl import FULL_SIZES, SCHEDULE, WORLDS, parse_override, prepare, run_once

from skillstate.sim.noise import SimNoise
from skillstate.sim.world import SimWorld


def expected_accuracy(world: SimWorld, skill: str, items: list[dict[str, Any]]) -> float:
    """The mean chance of a right answer over `items` for a target following `skill` (an answer the skill's
    "single word" rule cuts short is never right)."""
    total = 0.0
    for item in items:
        answer = item["answers"][0]
        cut = "single word" in skill.lower() and answer.replace(",", " ").split()[0] != answer
        total += 0.0 if cut else world.chance(skill, item.get("task_type", ""))
    return total / len(items)


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def world_of(args: argparse.Namespace) -> SimNoise:
    """The world's sim knobs, with those --knob sets (a world no default was chosen on)."""
    names = [f.name for f in dataclasses.fields(SimNoise)]
    changes: dict[str, Any] = {}
    for key, value in (parse_override(o) for o in args.knob):
        if key not in names:
            sys.exit(f"--knob: unknown sim knob {key!r} (one of {', '.join(names)})")
        try:
            changes[key] = int(value) if key == "length_free_chars" else float(value)
        except (TypeError, ValueError):
            sys.exit(f"--knob: {key} wants a number, got {value!r}")
    return dataclasses.replace(WORLDS[args.world], **changes)


def sweep(args: argparse.Namespace) -> None:
    noise = world_of(args)  # (bad knobs end here, before anything is written)
    work = Path(args.work_dir)
    data, skill, items = prepare(work, FULL_SIZES)
    judge = SimWorld(items, noise)
    test = [i for i in items if i["id"].startswith("test-")]
    out = []
    for seed in seeds_of(args.seeds):
        spec = {"data": str(data), "skill": str(skill), "seed": seed, "schedule": {**SCHEDULE, "epochs": args.epochs},
                "skillstate_config": dict(parse_override(o) for o in args.overrides)}
        result = run_once(args.program, 0.0, items, spec, work / f"{args.world}-{seed}-{args.program}", args.world,
                          noise)
        row = {"seed": seed, "test": result["test_best"], "calls": sum(result["calls"].values()),
               "unused": result.get("unused", 0),
               "expected": expected_accuracy(judge, result.get("best_skill", ""), test)}
        out.append(row)
        print(f"seed {seed}: test {row['test']:.3f}, expected {row['expected']:.3f}, {row['calls']} calls "
              f"({row['unused']} unused)",
              flush=True)
    (work / "results.json").write_text(json.dumps(out), encoding="utf-8")
    exp = [r["expected"] for r in out]
    sd = statistics.stdev(exp) if len(exp) > 1 else 0.0
    print(f"{args.program}, world {args.world}{''.join(', ' + o for o in args.knob + args.overrides)}, "
          f"{len(out)} seeds: "
          f"expected test accuracy {statistics.mean(exp):.3f} (sd {sd:.3f}, min {min(exp):.3f}); test "
          f"{statistics.mean(r['test'] for r in out):.3f}; calls {statistics.mean(r['calls'] for r in out):.0f} "
          f"({statistics.mean(r['unused'] for r in out):.0f} unused)")


def compare(a_dir: str, b_dir: str) -> None:
    def load(d: str) -> dict[int, dict[str, float]]:
        return {r["seed"]: r for r in json.loads((Path(d) / "results.json").read_text(encoding="utf-8"))}

    a, b = load(a_dir), load(b_dir)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        sys.exit("--compare: the two sweeps share fewer than two seeds")
    for key in ("expected", "test", "calls"):
        diff = [b[s][key] - a[s][key] for s in seeds]
        se = statistics.stdev(diff) / len(diff) ** 0.5
        print(f"{key}: {Path(b_dir).name} - {Path(a_dir).name} = {statistics.mean(diff):+.3f} (se {se:.3f}) over "
              f"{len(seeds)} seeds; higher at {sum(d > 1e-9 for d in diff)}, lower at {sum(d < -1e-9 for d in diff)}; "
              f"worst {min(diff):+.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--program", default="skillstate", choices=("skillstate", "skillrl"))
    parser.add_argument("--world", default="noisy", choices=sorted(WORLDS))
    parser.add_argument("--seeds", default="1-20", help="a range (1-20) or a list (1,2,3)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--work-dir", default=None, help="where the runs and results.json go (required to sweep)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a skillstate config key for its runs (repeatable)")
    parser.add_argument("--knob", action="append", default=[], metavar="KNOB=VALUE",
                        help="a sim knob of the world set otherwise (repeatable; skillstate.sim.noise.SimNoise)")
    parser.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="two sweeps' work directories")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    elif not args.work_dir:
        sys.exit("--work-dir is required for a sweep")
    else:
        sweep(args)


if __name__ == "__main__":
    main()
