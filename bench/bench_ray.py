"""executor ray against threads, and a model of a rollout batch on N machines.

    python bench/bench_ray.py [--items 16] [--concurrency 1 2 4] [--json]

1. Measured: evaluation runs of one skill on `--items` ScienceWorld
   episodes (find-living-thing, at most 20 turns), each in a fresh SQLite
   file, on threads and on ray (`ray_num_cpus: 1`, one actor per CPU of the
   local cluster), at each concurrency and endpoint latency. The target is
   the sim agent behind `skillstate sim-server` in a process of its own,
   reached through the openai client as a hosted model would be (it indexes
   the tasks' reference paths during an untimed first run). The local
   cluster is started once, before the runs, with all this machine's CPUs:
   its start is not in the figures, the actors' is. For each run: the wall
   time, episodes, target calls, the machine's busy CPU time (user, nice
   and system, from /proc/stat: Ray's workers run niced), and the driver's
   own CPU time per target call (on ray: its claims, the journal, the fold
   and Ray's own threads).
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
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray

from skillstate.config import SkillConfig
from skillstate.trainer import evaluate_skill

ENV_CONFIG = {"tasks": ["find-living-thing"]}
KEY = "BENCH_RAY_KEY"


def sw_config(items: int, executor: str, concurrency: int, base_url: str) -> SkillConfig:
    skill = Path(tempfile.mkdtemp()) / "skill.md"
    skill.write_text("# Skill\n\n- Look around first, then go to the room where the target is likely to be.\n")
    endpoint = {"model": "sim-model", "base_url": base_url, "api_key_env": KEY}
    return SkillConfig(env="scienceworld", backend="openai", target=endpoint, optimizer=endpoint,
                       initial_skill=str(skill), concurrency=concurrency, executor=executor, ray_num_cpus=1.0,
                       llm_cache="lineage", episode={"max_turns": 20},
                       env_config={**ENV_CONFIG, "items_per_split": {"train": 1, "val": 1, "test": items}})


class TargetServer:
    """`skillstate sim-server` playing these ScienceWorld tasks' agent, in its own process (so the driver's CPU
    time is the driver's alone), on a free port of 127.0.0.1."""

    def __init__(self, items: int, latency: float):
        self.latency = latency
        folder = Path(tempfile.mkdtemp())
        (folder / "world.json").write_text(json.dumps(
            {"env": "scienceworld", "env_config": {**ENV_CONFIG, "items_per_split": {"train": 1, "val": 1,
                                                                                      "test": items}}}))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "skillstate.cli.main", "sim-server", "--port", str(port),
                                      "--latency", str(latency), "--config", str(folder / "world.json")],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None and "serving" in self.proc.stdout.readline()
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def cpu_jiffies() -> list[int]:
    """This machine's CPU time so far by kind (user, nice, system, idle, ...), from /proc/stat."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def measure(items: int, executor: str, concurrency: int, server: TargetServer) -> dict:
    cfg = sw_config(items, executor, concurrency, server.base_url)
    db = f"sqlite:///{tempfile.mkdtemp()}/b.db"
    before, cpu, start = cpu_jiffies(), time.process_time(), time.perf_counter()
    result = evaluate_skill(cfg, "test", db=db)
    wall, cpu, after = time.perf_counter() - start, time.process_time() - cpu, cpu_jiffies()
    busy = sum(after[i] - before[i] for i in (0, 1, 2)) / os.sysconf("SC_CLK_TCK")  # user, nice, system
    usage = result.summary["usage"]["target"]
    assert result.summary["status"] == "evaluated", result.summary["status"]
    return {"executor": executor, "concurrency": concurrency, "episodes": items, "target_calls": usage["calls"],
            "llm_latency_s": server.latency, "wall_s": round(wall, 2), "machine_cpu_s": round(busy, 1),
            "driver_cpu_s": round(cpu, 2), "driver_cpu_ms_per_call": round(1000 * cpu / max(1, usage["calls"]), 3)}


def model(rows: list[dict], cores: int) -> list[dict]:
    by = {(r["executor"], r["concurrency"]): r for r in rows if r["llm_latency_s"] == 0}
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
    parser.add_argument("--latency", type=float, nargs="+", default=[0.0],
                        help="seconds the target endpoint holds each reply back (0: the instant sim)")
    parser.add_argument("--cores", type=int, default=8, help="cores per machine in the model")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    os.environ.setdefault(KEY, "local")
    rows = []
    for latency in args.latency:
        server = TargetServer(args.items, latency)
        measure(1, "threads", 1, server)  # untimed: the server indexes the tasks' reference paths
        for concurrency in args.concurrency:
            for executor in ("threads", "ray"):
                rows.append(measure(args.items, executor, concurrency, server))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        server.stop()
    ray.shutdown()
    out = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "measured": rows,
           "model": model(rows, args.cores) if 1 in args.concurrency else []}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"measured on {out['cpus']} CPUs, {out['date']}")
    for r in rows:
        print(f"  latency {r['llm_latency_s']} s, {r['executor']:7} concurrency {r['concurrency']}: "
              f"{r['wall_s']:6.1f} s for {r['episodes']} episodes ({r['target_calls']} calls), machine CPU "
              f"{r['machine_cpu_s']} s; driver CPU {r['driver_cpu_ms_per_call']} ms/call")
    for m in out["model"]:
        print(f"  L={m['llm_latency_s']}s N={m['machines']:3} slots={m['slots']:3}: batch {m['batch_s']:7.1f} s "
              f"(workers {m['worker_bound_s']}, driver {m['driver_bound_s']}) -> {m['bottleneck']}")


if __name__ == "__main__":
    main()
