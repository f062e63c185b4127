"""skillstate against skillrl 1.0.0, side by side, on the same simulated world.

    pip install -e ".[bench]"
    python bench/vs_skillrl.py [--smoke] [--latencies 0,0.2] [--repeats 2] [--stages] [--json FILE]
                               [--set KEY=VALUE ...]   (skillstate config keys for its runs)
    python bench/vs_skillrl.py --seeds 1,2,3,4,5 --worlds noisy,clean --epochs 4   (the seed sweep)

Both programs train on the same data (the bundled sim world: 120 train, 60
val, 60 test items) from the same initial skill, with the same schedule (2
epochs, batch 40, minibatch 8, edit budget 4 down to 2 on cosine) and the
same cap of 8 calls in flight, against the project's sim server on
127.0.0.1 with each reply held back by the injected latency. Each run gets
a fresh server, so the calls per role are counted there, the same way for
both, and a fresh process and work directory (skillstate: a new SQLite
database). The runs are interleaved: at each latency skillstate, skillrl,
skillstate, skillrl.

It prints one table: per latency and program the mean wall time of the
training call (and of each run), the whole process's time (start-up and
imports too), the calls per role, skillstate's unused calls (sent calls no
event uses: speculation that missed, calls in flight at an early reject; as
its summary counts them, 0 for skillrl), the mean calls in flight, the baseline and
best val and test scores (hard); then each value as a ratio to skillrl's.
Below it, the goals of issue 10, met or not. --smoke: 40 train, 24 val and 24
test items, one repeat.

The seed sweep (--seeds with more than one seed, or --sweep): both programs
at each seed and in each world (--worlds: `clean`, the default sim world,
`noisy`, the sim's noisy mode at its moderate levels, `sim.noise:
moderate`, and `blocking`, the same with lines that block another task
type, `sim.noise: blocking`; played by the server for both), at the first
latency (default 0). It prints, per world and program, the mean, spread and range over the
seeds of the best skill's test score, the best val score, the val-to-test
gap (best val minus its test) and the calls; then each seed's test scores
side by side, and the goals of issue 21.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from contenders import KEY_ENV

from skillstate.sim.noise import BLOCKING, MODERATE, SimNoise
from skillstate.sim.server import SimServer
from skillstate.sim.world import SimWorld, bundled_skill, bundled_splits

HERE = Path(__file__).resolve().parent
PROGRAMS = ("skillstate", "skillrl")
SCHEDULE = {"epochs": 2, "batch_size": 40, "minibatch_size": 8, "edit_budget": 4, "min_edit_budget": 2,
            "concurrency": 8}
FULL_SIZES = {"train": 120, "val": 60, "test": 60}
SMOKE_SIZES = {"train": 40, "val": 24, "test": 24}
SEED = 42
WORLDS = {"clean": SimNoise(), "noisy": SimNoise(**MODERATE), "blocking": SimNoise(**BLOCKING)}


def prepare(work: Path, sizes: dict[str, int]) -> tuple[Path, Path, list[dict[str, Any]]]:
    """The shared data directory and initial skill file, and every item (for the server's world)."""
    splits = bundled_splits(sizes)
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, items in splits.items():
        (data / f"{name}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    skill = work / "initial_skill.md"
    skill.write_text(bundled_skill(), encoding="utf-8")
    return data, skill, [i for items in splits.values() for i in items]


def run_once(program: str, latency: float, items: list[dict[str, Any]], spec: dict[str, Any],
             work: Path, world: str = "clean", noise: SimNoise | None = None) -> dict[str, Any]:
    """One program's run against a fresh server of the world `world` (or of `noise`, a world's knobs set
    otherwise, when given)."""
    work.mkdir(parents=True)
    with SimServer(SimWorld(items, noise or WORLDS[world]), latency=latency) as server:
        spec_file = work / "spec.json"
        spec_file.write_text(json.dumps({**spec, "base_url": server.base_url, "work": str(work)}), encoding="utf-8")
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / "contenders.py"), program, str(spec_file)],
                              capture_output=True, text=True, env={**os.environ, KEY_ENV: "local"})
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{program} at {latency:g} s latency failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        busy = sum(end - begin for _, begin, end in server.spans)
        result.update(program=program, latency=latency, process_s=process_s, calls=dict(server.calls),
                      in_flight=busy / result["wall_s"] if result["wall_s"] else 0.0, world=world, seed=spec["seed"])
    return result


COLUMNS = [  # (header, key, format)
    ("wall s", "wall_s", "{:.2f}"), ("process s", "process_s", "{:.2f}"), ("target", "target", "{:.0f}"),
    ("optimizer", "optimizer", "{:.0f}"), ("calls", "total", "{:.0f}"), ("unused", "unused", "{:.0f}"),
    ("in flight", "in_flight", "{:.1f}"), ("val base", "val_baseline", "{:.3f}"), ("val best", "val_best", "{:.3f}"),
    ("test base", "test_baseline", "{:.3f}"), ("test best", "test_best", "{:.3f}"),
]


def means(runs: list[dict[str, Any]]) -> dict[str, float]:
    rows = [{**r, "target": r["calls"].get("target", 0), "optimizer": r["calls"].get("optimizer", 0),
             "total": sum(r["calls"].values())} for r in runs]
    return {key: statistics.mean(float(r[key]) for r in rows) for _, key, _ in COLUMNS}


def table(results: list[dict[str, Any]]) -> tuple[list[str], dict[float, dict[str, dict[str, float]]]]:
    head = ["latency", "program", "runs (wall s)"] + [h for h, _, _ in COLUMNS]
    rows: list[list[str]] = []
    summary: dict[float, dict[str, dict[str, float]]] = {}
    for latency in sorted({r["latency"] for r in results}):
        at = summary.setdefault(latency, {})
        for program in PROGRAMS:
            runs = [r for r in results if r["latency"] == latency and r["program"] == program]
            at[program] = m = means(runs)
            walls = ", ".join(f"{r['wall_s']:.2f}" for r in runs)
            rows.append([f"{latency:g} s", program, walls] + [f.format(m[k]) for _, k, f in COLUMNS])
        ratio = [f"{at['skillstate'][k] / at['skillrl'][k]:.2f}x" if at["skillrl"][k] and k != "unused" else "-"
                 for _, k, _ in COLUMNS]
        rows.append([f"{latency:g} s", "skillstate/skillrl", ""] + ratio)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths,
             strict=True))) for row in [head, ["-" * w for w in widths], *rows]]
    return lines, summary


def goals(summary: dict[float, dict[str, dict[str, float]]]) -> list[str]:
    out = []
    for latency, at in summary.items():
        ours, theirs = at["skillstate"], at["skillrl"]
        wall, calls = ours["wall_s"] / theirs["wall_s"], ours["total"] / theirs["total"]
        test = "met" if ours["test_best"] >= theirs["test_best"] else "not met"
        if latency == 0:
            verdict = "met" if wall <= 1.0 else "not met"
            out.append(f"at 0 s: engine overhead (wall) {wall:.2f}x skillrl's, goal <= 1.00x: {verdict}")
        else:
            out.append(f"at {latency:g} s: wall {wall:.2f}x (goal <= 0.50x: {'met' if wall <= 0.5 else 'not met'}), "
                       f"calls {calls:.2f}x (goal <= 0.85x: {'met' if calls <= 0.85 else 'not met'}), test best "
                       f"{ours['test_best']:.3f} vs {theirs['test_best']:.3f} (goal equal or better: {test})")
    return out


def stage_lines(results: list[dict[str, Any]]) -> list[str]:
    """Mean seconds per stage, per latency and program (what each program reports of its own stages)."""
    out = ["", "seconds per stage (mean over runs)"]
    for latency in sorted({r["latency"] for r in results}):
        for program in PROGRAMS:
            runs = [r for r in results if r["latency"] == latency and r["program"] == program]
            seconds = {s: statistics.mean(r["stages_s"].get(s, 0.0) for r in runs) for r in runs for s in r["stages_s"]}
            parts = [f"{s} {t:.2f}" for s, t in sorted(seconds.items(), key=lambda kv: -kv[1])]
            out.append(f"  {latency:g} s  {program:10}  " + ", ".join(parts))
    return out


SWEEP = [  # (header, value of one run, format)
    ("test best", lambda r: r["test_best"], "{:.3f}"), ("val best", lambda r: r["val_best"], "{:.3f}"),
    ("val-test gap", lambda r: r["val_best"] - r["test_best"], "{:+.3f}"),
    ("calls", lambda r: sum(r["calls"].values()), "{:.0f}"),
]
ANATOMY = [("chars", "{:.0f}"), ("harmful", "{:.1f}"), ("repeats", "{:.1f}")]


def anatomy(skill: str, world: SimWorld) -> dict[str, int]:
    """What a best skill holds: its length, its lines that break another task type (the noisy world's traps, or
    the sim's harmful rules), and the rules it states more than once (paraphrases)."""
    lines = [ln.lower() for ln in skill.splitlines()]
    traps = [t.key for t in world.cross_harms] + [h.key for h in world.harms] + [b.key for b in world.blockers]
    keys = world.all_rule_keys()
    return {"chars": len(skill), "harmful": sum(1 for ln in lines if any(k in ln for k in traps)),
            "repeats": sum(max(0, sum(1 for ln in lines if k in ln) - 1) for k in keys)}


def spread(values: list[float], fmt: str) -> str:
    """mean (standard deviation) [min to max]."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return (f"{fmt.format(statistics.mean(values))} ({fmt.format(sd).lstrip('+')}) "
            f"[{fmt.format(min(values))} to {fmt.format(max(values))}]")


def aligned(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [head, ["-" * w for w in widths], *rows]]


def sweep_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per world and program, each measure's mean, spread and range over the seeds, and what the best skills
    hold; then each seed's scores side by side, and the goals of issue 21."""
    rows, anatomy_rows = [], []
    worlds = list(dict.fromkeys(r["world"] for r in results))
    for world in worlds:
        for program in PROGRAMS:
            runs = [r for r in results if r["world"] == world and r["program"] == program]
            rows.append([world, program, str(len({r["seed"] for r in runs}))]
                        + [spread([float(value(r)) for r in runs], fmt) for _, value, fmt in SWEEP])
            anatomy_rows.append([world, program] + [
                f"{fmt.format(statistics.mean(r['anatomy'][k] for r in runs))} "
                f"[{min(r['anatomy'][k] for r in runs)} to {max(r['anatomy'][k] for r in runs)}]"
                for k, fmt in ANATOMY])
    out = aligned(["world", "program", "seeds"] + [h for h, _, _ in SWEEP], rows)
    out += ["", "the best skills: characters, lines that break another task type, rules stated more than once "
            "(mean [min to max])"]
    out += aligned(["world", "program", "chars", "harmful lines", "repeated rules"], anatomy_rows)
    out += ["", "test best per seed (skillstate / skillrl; val best in brackets)"]
    for world in worlds:
        by = {(r["program"], r["seed"]): r for r in results if r["world"] == world}
        seeds = sorted({seed for _, seed in by})
        out.append(f"  {world:6} " + ", ".join(
            f"{seed}: {by[('skillstate', seed)]['test_best']:.3f} [{by[('skillstate', seed)]['val_best']:.3f}] / "
            f"{by[('skillrl', seed)]['test_best']:.3f} [{by[('skillrl', seed)]['val_best']:.3f}]"
            for seed in seeds if ("skillstate", seed) in by and ("skillrl", seed) in by))
    return out + [""] + sweep_goals(results)


def sweep_goals(results: list[dict[str, Any]]) -> list[str]:
    out = []
    for world in dict.fromkeys(r["world"] for r in results):
        pairs = [(a, b) for a in results for b in results if a["world"] == b["world"] == world
                 and a["seed"] == b["seed"] and a["program"] == "skillstate" and b["program"] == "skillrl"]
        if not pairs:
            continue
        lead = statistics.mean(a["test_best"] - b["test_best"] for a, b in pairs)
        worst = min(a["test_best"] - b["test_best"] for a, b in pairs)
        calls = statistics.mean(sum(a["calls"].values()) for a, _ in pairs) / statistics.mean(
            sum(b["calls"].values()) for _, b in pairs)
        if world == "noisy":
            out.append(f"noisy: mean test lead over skillrl {lead:+.3f} (goal >= +0.10: "
                       f"{'met' if lead >= 0.10 else 'not met'}), worst seed {worst:+.3f} (goal >= -0.05: "
                       f"{'met' if worst >= -0.05 else 'not met'}), calls {calls:.2f}x (goal <= 1.00x: "
                       f"{'met' if calls <= 1.0 else 'not met'})")
        else:
            out.append(f"{world}: mean test lead over skillrl {lead:+.3f}, worst seed {worst:+.3f}, calls {calls:.2f}x")
    return out


def noise_of(text: str) -> SimNoise:
    """--noise: `moderate`, or KEY=VALUE pairs (every other knob off)."""
    if text.strip() == "moderate":
        return SimNoise(**MODERATE)
    knobs = dict(parse_override(pair) for pair in text.split(",") if pair.strip())
    try:
        return SimNoise(**knobs)
    except TypeError as err:
        sys.exit(f"--noise: {err}")


def parse_override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        sys.exit(f"--set wants KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="40/24/24 items and one repeat (a quick check)")
    parser.add_argument("--latencies", default=None,
                        help="seconds per reply, comma-separated (default 0,0.2; the sweep: 0)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per program and latency (default 2; smoke 1)")
    parser.add_argument("--stages", action="store_true", help="also print the seconds each program spent per stage")
    parser.add_argument("--json", dest="json_out", default=None, help="write every run's result to this file")
    parser.add_argument("--work-dir", default=None, help="keep the data, databases and outputs here")
    parser.add_argument("--seed", type=int, default=SEED, help=f"both programs' seed (default {SEED})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a skillstate config key for its runs, e.g. speculative_rollout=true (repeatable)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds: the seed sweep when more than one")
    parser.add_argument("--sweep", action="store_true", help="print the seed sweep's table even for one seed")
    parser.add_argument("--worlds", default=None, help="clean, noisy and/or blocking, comma-separated (default "
                                                       "clean; the sweep: noisy,clean)")
    parser.add_argument("--noise", default="moderate", metavar="moderate|KEY=VALUE,...",
                        help="the noisy world: the sim's moderate levels (default), or only the knobs given, e.g. "
                             "rank_noise=1,answer_noise=0.7 (the keys of sim.*, without the sim.)")
    parser.add_argument("--epochs", type=int, default=SCHEDULE["epochs"],
                        help=f"both programs' epochs (default {SCHEDULE['epochs']})")
    parser.add_argument("--sizes", default=None, metavar="TRAIN,VAL,TEST",
                        help="items per split of the bundled world (default 120,60,60; smoke 40,24,24)")
    args = parser.parse_args()
    try:
        import skillrl  # noqa: F401
    except ImportError:
        sys.exit('skillrl is not installed: pip install -e ".[bench]" (it pins skillrl==1.0.0)')
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else [args.seed]
    sweep = args.sweep or len(seeds) > 1
    worlds = [w.strip() for w in (args.worlds or ("noisy,clean" if sweep else "clean")).split(",") if w.strip()]
    if unknown := [w for w in worlds if w not in WORLDS]:
        sys.exit(f"--worlds: unknown world {unknown[0]!r} (clean, noisy or blocking)")
    latencies = [float(x) for x in (args.latencies or ("0" if sweep else "0,0.2")).split(",") if x.strip()]
    repeats = args.repeats or (1 if args.smoke or sweep else 2)
    WORLDS["noisy"] = noise_of(args.noise)
    sizes = SMOKE_SIZES if args.smoke else FULL_SIZES
    if args.sizes:
        sizes = dict(zip(("train", "val", "test"), (int(x) for x in args.sizes.split(",")), strict=True))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="vs-skillrl-"))
    data, skill, items = prepare(work, sizes)
    schedule = {**SCHEDULE, "epochs": args.epochs}
    results = []
    judge = SimWorld(items, SimNoise(**BLOCKING))  # it knows every harmful rule and blocking line, to read the skills
    for world in worlds:
        for seed in seeds:
            spec = {"data": str(data), "skill": str(skill), "seed": seed, "schedule": schedule,
                    "skillstate_config": dict(parse_override(o) for o in args.overrides)}
            for latency in latencies:
                for repeat in range(repeats):
                    for program in PROGRAMS:
                        name = f"{world}-{seed}-{program}-{latency:g}s-{repeat + 1}"
                        result = run_once(program, latency, items, spec, work / name, world)
                        result["anatomy"] = anatomy(result.get("best_skill", ""), judge)
                        print(f"# {world} world, seed {seed}: {program} at {latency:g} s, run {repeat + 1}: "
                              f"{result['wall_s']:.2f} s, {sum(result['calls'].values())} calls, test best "
                              f"{result['test_best']:.3f}", file=sys.stderr)
                        results.append(result)
    extra = "".join(f", {o}" for o in args.overrides)
    noisy = "" if "noisy" not in worlds or args.noise == "moderate" else f" ({args.noise})"
    print(f"skillstate vs skillrl 1.0.0: {len(items)} items, {args.epochs} epochs, batch 40, minibatch 8, budget "
          f"4->2 cosine, cap 8, seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}, "
          f"{repeats} run(s) each, world{'s' if len(worlds) > 1 else ''} {','.join(worlds)}{noisy}{extra}")
    if sweep:
        print("\n".join(sweep_lines(results)))
    else:
        lines, summary = table(results)
        print("\n".join(lines + [""] + goals(summary) + (stage_lines(results) if args.stages else [])))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
