"""Benchmark: default sim runs of the agent environments (sql, and with the
textworlds extra textworld_express and scienceworld), timing the world.

Run on demand:  python bench/bench_agents.py [--env NAME ...] [--set KEY=VALUE ...]
For each environment: baseline and best success on val and test, steps,
accepts and rejects, LLM calls, the wall time of the run, the time spent
inside the environment (opening episodes, stepping, running tools) and the
wall time of `replay --verify`, which plays every episode again.
Results depend on the machine; docs/benchmarks.md records one measurement.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import yaml

from skillstate import SkillConfig, Trainer
from skillstate.envs.registry import resolve_env
from skillstate.reading.audit import verify

ENV_TIME = {"seconds": 0.0}
_LOCK = threading.Lock()


def _add(seconds: float) -> None:
    with _LOCK:
        ENV_TIME["seconds"] += seconds


def timing(fn):
    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(time.perf_counter() - start)

    return wrapped


def instrument(name: str) -> None:
    """Time the world's own work: opening an episode, each step, each tool call."""
    cls = resolve_env(name)
    if hasattr(cls, "call_tool"):
        cls.call_tool = timing(cls.call_tool)  # type: ignore[method-assign]
    if hasattr(cls, "open"):
        original = cls.open

        def open_timed(self, item, seed):
            start = time.perf_counter()
            session = original(self, item, seed)
            _add(time.perf_counter() - start)
            step = session.step
            session.step = timing(step)  # type: ignore[method-assign]
            return session

        cls.open = open_timed  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", action="append", help="environments (default: sql, textworld_express, scienceworld)")
    parser.add_argument("--set", action="append", default=[], help="config KEY=VALUE for every run")
    args = parser.parse_args()
    extra = {}
    for assignment in args.set:
        key, _, value = assignment.partition("=")
        extra[key] = yaml.safe_load(value)
    directory = Path(tempfile.mkdtemp())
    for name in args.env or ["sql", "textworld_express", "scienceworld"]:
        ENV_TIME["seconds"] = 0.0
        instrument(name)
        trainer = Trainer(SkillConfig(env=name, **extra), db=f"sqlite:///{directory / name}.db", run_id=name)
        start = time.perf_counter()
        s = trainer.train().summary
        wall = time.perf_counter() - start
        in_env = ENV_TIME["seconds"]
        start = time.perf_counter()
        report = verify(trainer.store, name)
        verify_wall = time.perf_counter() - start
        calls = {role: u["calls"] for role, u in s["usage"].items()}
        print(f"{name}: val {s['baseline_score']:.3f} -> {s['best_score']:.3f}, "
              f"test {s['test']['baseline']['hard']:.3f} -> {s['test']['best']['hard']:.3f}; "
              f"{s['steps']} steps, {s['accepts']} accepted, {s['rejects']} rejected; calls {calls}; "
              f"run {wall:.1f} s, inside the world {in_env:.1f} s (summed over threads); "
              f"verify {'ok' if report.ok else report.divergence} in {verify_wall:.1f} s")


if __name__ == "__main__":
    main()
