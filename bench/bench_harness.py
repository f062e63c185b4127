"""Benchmark: workspace tasks with the built-in agent and with external agents, and the sandbox's cost.

Run on demand:  python bench/bench_harness.py [--agent builtin|command|codex|qwen|claude ...] [--set KEY=VALUE ...]
                python bench/bench_harness.py --overhead-only

For each agent, a default offline run on the bundled tasks (examples/skills/workspace.yaml's settings,
the sim backend): baseline and best success on val and test, the target calls (for an external agent,
each one a call through the journaling proxy), the rollouts, and the wall seconds per rollout (the
run's wall time over its rollouts, with `concurrency` rollouts at a time). Then the sandbox's
overhead: one command (`true`) under bubblewrap against without a sandbox, and one harness rollout
(the command agent, examples/agents/shell_agent.py, on one task) under bubblewrap with the proxy's
bridge against without a sandbox. Results depend on the machine; docs/benchmarks.md records one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from skillstate import SkillConfig, Trainer
from skillstate.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "skills" / "workspace.yaml"
AGENT = ROOT / "examples" / "agents" / "shell_agent.py"
HARNESS = {"builtin": {"kind": "builtin"},
           "command": {"kind": "command", "command": [sys.executable, str(AGENT), "{task}"],
                       "show": [str(AGENT.parent)]},
           "codex": {"kind": "codex"}, "qwen": {"kind": "qwen"}, "claude": {"kind": "claude"}}


def example_config(agent: str, overrides: list[str]) -> SkillConfig:
    data = yaml.safe_load(EXAMPLE.read_text())
    folder = EXAMPLE.parent
    data["initial_skill"] = str(folder / data["initial_skill"])
    data["distractor_skills"] = [str(folder / p) for p in data.get("distractor_skills", [])]
    data["env_config"] = {"harness": HARNESS[agent]}
    for item in overrides:
        key, _, value = item.partition("=")
        data[key] = yaml.safe_load(value)
    return SkillConfig(**data)


def one_run(agent: str, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/bench.db")
        start = time.perf_counter()
        Trainer(example_config(agent, overrides), store=store, run_id="b").train()
        wall = time.perf_counter() - start
        rollouts = 0
        for stored in store.read_events("b"):
            payload = json.loads(stored.payload)
            results = payload.get("results")
            if isinstance(results, list):
                rollouts += len(results)
            elif isinstance(results, str):
                rollouts += len(json.loads(store.get_blob(results)))
        from skillstate.engine.loading import load_run
        from skillstate.reading.history import run_summary

        summary = run_summary(store, load_run(store, "b"))
        store.close()
    return {"agent": agent, "summary": summary, "wall": wall, "rollouts": rollouts,
            "target_calls": summary["usage"]["target"]["sent"]}


def sandbox_overhead(repeat: int) -> dict[str, float]:
    from skillstate.envs.workspace.sandbox import SandboxSettings, run_command

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("bwrap", "none"):
            settings = SandboxSettings(kind=kind)
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                run_command("true", Path(tmp), settings)
                times.append(time.perf_counter() - start)
            out[f"command {kind}"] = statistics.median(times)
    return out


def harness_overhead(repeat: int) -> dict[str, float]:
    """Seconds of one command-agent rollout on one task, under bubblewrap and without a sandbox."""
    from skillstate.envs.registry import env_settings, resolve_env
    from skillstate.envs.workspace.tasks import bundled_splits
    from skillstate.llm.base import CallResult, ChatRequest
    from skillstate.log.values import CallRef
    from skillstate.sim.backend import sim_backend_for

    item = bundled_splits(["train"])["train"][0]
    out: dict[str, float] = {}
    for kind in ("bwrap", "none"):
        cls = resolve_env("workspace")
        env = cls({"train": [item]}, env_settings(cls, {"harness": HARNESS["command"], "sandbox": {"kind": kind}},
                                                  "workspace"))
        backend = sim_backend_for(env)

        def complete(messages, tools=None, backend=backend):
            request = ChatRequest.build("sim", "sim-target", messages, 0.0, 512, tools=tools)
            resp = backend.complete(request)
            return CallResult(CallRef(request_hash=request.hash, role="target"), text=resp.text,
                              tool_calls=resp.tool_calls)

        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            env.rollout(env.default_skill(), item, complete, {})
            times.append(time.perf_counter() - start)
        out[f"rollout {kind}"] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", action="append", choices=sorted(HARNESS))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--overhead-only", action="store_true")
    args = parser.parse_args()
    if not args.overhead_only:
        print("| agent | val baseline → best | test baseline → best | target calls | rollouts | s per rollout |")
        print("|---|---|---|---|---|---|")
        for agent in args.agent or sorted(HARNESS):
            r = one_run(agent, args.set)
            s = r["summary"]
            test = {label: t["hard"] for label, t in s["test"].items()}
            print(f"| {agent} | {s['baseline_score']:.3f} → {s['best_score']:.3f} | "
                  f"{test.get('baseline', float('nan')):.3f} → {test.get('best', float('nan')):.3f} | "
                  f"{r['target_calls']} | {r['rollouts']} | {r['wall'] / max(1, r['rollouts']):.2f} |", flush=True)
    cmd = sandbox_overhead(args.repeat)
    roll = harness_overhead(max(1, args.repeat // 3))
    print(f"\none command: {cmd['command bwrap'] * 1000:.1f} ms under bubblewrap, {cmd['command none'] * 1000:.1f} ms "
          f"without: {1000 * (cmd['command bwrap'] - cmd['command none']):.1f} ms of sandbox")
    print(f"one command-agent rollout: {roll['rollout bwrap']:.2f} s under bubblewrap (with the bridge), "
          f"{roll['rollout none']:.2f} s without: {roll['rollout bwrap'] - roll['rollout none']:.2f} s of sandbox")


if __name__ == "__main__":
    main()
