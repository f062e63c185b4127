"""executor ray against threads, and a model of a rollout batch on N machines.

    python bench/bench_ray.py [--items 16] [--concurrency 1 2 4] [--json]

1. Measured: evaluation runs of ScienceWorld's bundled skill on `--items`
   episodes (find-living-thing, at most 20 turns, the sim agent as the
   target), each in a fresh SQLite file, on threads and on ray
   (`ray_num_cpus: 1`, one actor per CPU of the local cluster), at each
   concurrency. The local cluster is started once, before the runs, with
   all this machine's CPUs: its start is not in the figures, the actors' is.
   For each run: the wall time, episodes, target calls, and the driver's
   own CPU time per target call (everything the driver does for a call on
   ray: claim, journal, fold).
2. Modelled: a 100-item rollout batch on N machines of `--cores` cores,
   with a hosted model answering each call in L seconds. An episode takes
   turns x (L + r) + e, where e is its environment CPU (measured: a serial
   threads run's wall time per episode, whose LLM is the instant sim) and r
   the ray round trip a call adds (measured: ray against threads at
   concurrency 1, per call). With one actor per core the batch runs in
   ceil(100 / (N x cores)) waves. The driver handles every call on one
   core, d CPU seconds each (measured), so the batch takes at least
   100 x turns x d: once the workers ask for calls faster than 1/d a
   second, the driver is the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import ray

from skillstate.config import SkillConfig
from skillstate.trainer import evaluate_skill


def sw_config(items: int, executor: str, concurrency: int) -> SkillConfig:
    skill = Path(tempfile.mkdtemp()) / "skill.md"
    skill.write_text("# Skill\n\n- Look around first, then go to the room where the target is likely to be.\n")
    return SkillConfig(env="scienceworld", initial_skill=str(skill), concurrency=concurrency, executor=executor,
                       ray_num_cpus=1.0, llm_cache="lineage", episode={"max_turns": 20},
                       env_config={"tasks": ["find-living-thing"],
                                   "items_per_split": {"train": 1, "val": 1, "test": items}})


def measure(items: int, executor: str, concurrency: int) -> dict:
    cfg = sw_config(items, executor, concurrency)
    db = f"sqlite:///{tempfile.mkdtemp()}/b.db"
    cpu, start = time.process_time(), time.perf_counter()
    result = evaluate_skill(cfg, "test", db=db)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    usage = result.summary["usage"]["target"]
    assert result.summary["status"] == "evaluated", result.summary["status"]
    return {"executor": executor, "concurrency": concurrency, "episodes": items, "target_calls": usage["calls"],
            "wall_s": round(wall, 2), "driver_cpu_s": round(cpu, 2),
            "driver_cpu_ms_per_call": round(1000 * cpu / max(1, usage["calls"]), 3)}


def model(rows: list[dict], cores: int) -> list[dict]:
    by = {(r["executor"], r["concurrency"]): r for r in rows}
    serial, ray1 = by[("threads", 1)], by[("ray", 1)]
    turns = serial["target_calls"] / serial["episodes"]
    env_s = serial["wall_s"] / serial["episodes"]  # one episode's environment and agent work, serially
    rtt = max(0.0, (ray1["wall_s"] - serial["wall_s"]) / ray1["target_calls"])
    d = max(r["driver_cpu_ms_per_call"] for r in rows if r["executor"] == "ray") / 1000
    out = []
    for latency in (1.0, 0.2):
        for machines in (1, 2, 4, 8, 16, 32, 64):
            slots = min(100, machines * cores)
            episode = turns * (latency + rtt) + env_s
            workers = math.ceil(100 / slots) * episode
            driver = 100 * turns * d
            out.append({"llm_latency_s": latency, "machines": machines, "cores_each": cores, "slots": slots,
                        "worker_bound_s": round(workers, 1), "driver_bound_s": round(driver, 1),
                        "batch_s": round(max(workers, driver), 1),
                        "bottleneck": "driver" if driver >= workers else "workers"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--cores", type=int, default=8, help="cores per machine in the model")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows = []
    for concurrency in args.concurrency:
        for executor in ("threads", "ray"):
            rows.append(measure(args.items, executor, concurrency))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    ray.shutdown()
    out = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "measured": rows,
           "model": model(rows, args.cores) if 1 in args.concurrency else []}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"measured on {out['cpus']} CPUs, {out['date']}")
    for r in rows:
        print(f"  {r['executor']:7} concurrency {r['concurrency']}: {r['wall_s']:6.1f} s for {r['episodes']} episodes "
              f"({r['target_calls']} calls); driver CPU {r['driver_cpu_ms_per_call']} ms/call")
    for m in out["model"]:
        print(f"  L={m['llm_latency_s']}s N={m['machines']:3} slots={m['slots']:3}: batch {m['batch_s']:7.1f} s "
              f"(workers {m['worker_bound_s']}, driver {m['driver_bound_s']}) -> {m['bottleneck']}")


if __name__ == "__main__":
    main()
