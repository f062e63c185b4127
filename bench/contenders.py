"""One training run of skillstate or skillrl against an OpenAI-compatible
server, in its own process, for bench/vs_skillrl.py.

    python bench/contenders.py skillstate|skillrl SPEC.json

SPEC names the server, the data directory, the initial skill file, a work
directory and the schedule. The run's result is printed as one JSON object:
wall time of the training call, baseline and best val and test scores,
seconds per stage, what the run itself reports of its calls, and the best
skill.

Both programs import the `openai` package lazily, on their first client; it
takes most of a second, the same for both, so it is imported before the
clock starts (the bench's process time includes it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

KEY_ENV = "SKILLSTATE_BENCH_KEY"  # the sim server wants a bearer token, any value; the bench sets this one
TARGET_MODEL, OPTIMIZER_MODEL = "sim-target", "sim-optimizer"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def unused_calls(summary: dict[str, Any]) -> int:
    """Sent calls that no event of the run uses (speculation that missed,
    calls in flight when an early reject became certain), as the summary
    counts them per role; 0 when it does not."""
    return sum(int(u.get("unused", 0)) for u in summary.get("usage", {}).values())


class StageClock:
    """Seconds per stage, from skillstate's progress callback: each stage
    runs until the next one starts; "setup" is the time before the first
    (creating the run: config, endpoint check, database)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stage: str | None = "setup"
        self._since = time.perf_counter()

    def __call__(self, progress: Any) -> None:
        if progress.kind == "stage":
            self._switch(progress.stage)

    def _switch(self, stage: str | None) -> None:
        now = time.perf_counter()
        if self._stage is not None:
            self.seconds[self._stage] = self.seconds.get(self._stage, 0.0) + now - self._since
        self._stage, self._since = stage, now

    def close(self) -> dict[str, float]:
        self._switch(None)
        return self.seconds


def run_skillstate(spec: dict[str, Any]) -> dict[str, Any]:
    from skillstate import Trainer
    from skillstate.config_views import validate_config

    schedule = spec["schedule"]
    model = {"base_url": spec["base_url"], "api_key_env": KEY_ENV}
    config = validate_config({
        "backend": "openai", "data": spec["data"], "initial_skill": spec["skill"], "seed": spec["seed"],
        "num_epochs": schedule["epochs"], "batch_size": schedule["batch_size"],
        "minibatch_size": schedule["minibatch_size"], "edit_budget": schedule["edit_budget"],
        "min_edit_budget": schedule["min_edit_budget"], "lr_scheduler": "cosine",
        "concurrency": schedule["concurrency"], "gate_metric": "hard",
        "target": {**model, "model": TARGET_MODEL}, "optimizer": {**model, "model": OPTIMIZER_MODEL},
        **spec.get("skillstate_config", {}),
    })
    clock = StageClock()
    start = time.perf_counter()
    trainer = Trainer(config, db=f"sqlite:///{Path(spec['work']) / 'skillstate.db'}", run_id="bench",
                      on_progress=clock)
    result = trainer.train()
    wall = time.perf_counter() - start
    s = result.summary
    return {
        "wall_s": wall, "stages_s": clock.close(), "status": s["status"], "steps": s["steps"],
        "accepts": s["accepts"], "rejects": s["rejects"], "skips": s["skips"],
        "val_baseline": s["baseline_score"],
        "val_best": (s.get("val_to_test") or {}).get("best_val", s["best_score"]),  # final selection: not the pick's
        "val_to_test": s.get("val_to_test"),
        "test_baseline": s["test"]["baseline"]["hard"], "test_best": s["test"]["best"]["hard"],
        "unused": unused_calls(s),
        "sent": {role: u.get("sent", u["calls"]) for role, u in s["usage"].items()}, "best_skill": result.best_skill,
    }


def run_skillrl(spec: dict[str, Any]) -> dict[str, Any]:
    from skillrl import SkillOptConfig, SkillOptTrainer
    from skillrl.envs.qa import SimpleQAEnv
    from skillrl.llm.openai_client import OpenAIChatClient

    class TimedTrainer(SkillOptTrainer):
        """skillrl's trainer, timing its split evaluations (baseline, gate, test)."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.eval_seconds: dict[str, float] = {}

        def _eval_on_split(self, skill, split, out_subdir):
            start = time.perf_counter()
            try:
                return super()._eval_on_split(skill, split, out_subdir)
            finally:
                label = "baseline" if out_subdir.startswith("baseline") else (
                    "test" if out_subdir.startswith("test") else "evaluate")
                self.eval_seconds[label] = self.eval_seconds.get(label, 0.0) + time.perf_counter() - start

    schedule = spec["schedule"]
    data = Path(spec["data"])
    work = Path(spec["work"]) / "skillrl"
    start = time.perf_counter()
    env = SimpleQAEnv(train_items=read_jsonl(data / "train.jsonl"), val_items=read_jsonl(data / "val.jsonl"),
                      test_items=read_jsonl(data / "test.jsonl"))
    clients = {name: OpenAIChatClient(model=name, api_key="local", base_url=spec["base_url"])
               for name in (TARGET_MODEL, OPTIMIZER_MODEL)}
    config = SkillOptConfig(
        num_epochs=schedule["epochs"], batch_size=schedule["batch_size"], minibatch_size=schedule["minibatch_size"],
        edit_budget=schedule["edit_budget"], min_edit_budget=schedule["min_edit_budget"], lr_scheduler="cosine",
        gate_metric="hard", workers=schedule["concurrency"], seed=spec["seed"], out_root=str(work), verbose=False)
    trainer = TimedTrainer(config=config, env=env, optimizer_client=clients[OPTIMIZER_MODEL],
                           target_client=clients[TARGET_MODEL],
                           initial_skill=Path(spec["skill"]).read_text(encoding="utf-8"))
    s = trainer.train()
    wall = time.perf_counter() - start
    stages = dict(trainer.eval_seconds)
    for record in trainer.history:
        for key, seconds in record.get("timing", {}).items():
            if key != "evaluate_s":  # already timed as "evaluate" (a cached gate score takes no call)
                stages[key.removesuffix("_s")] = stages.get(key.removesuffix("_s"), 0.0) + seconds
    stages["other"] = wall - sum(stages.values())  # setup, writing its files, what the timings leave out
    baseline = json.loads((work / "baseline_selection_eval" / "summary.json").read_text(encoding="utf-8"))
    return {
        "wall_s": wall, "stages_s": stages, "status": "completed", "steps": s["total_steps"],
        "accepts": s["total_accepts"], "rejects": s["total_rejects"], "skips": s["total_skips"],
        "val_baseline": baseline["hard"], "val_best": s["best_selection_score"],
        "test_baseline": s["baseline_test_hard"], "test_best": s["test_hard"], "unused": 0,
        "best_skill": trainer.best_skill,
    }


def main() -> None:
    program, spec_path = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    import openai  # noqa: F401  (see the module docstring)
    runner = {"skillstate": run_skillstate, "skillrl": run_skillrl}[program]
    print(json.dumps(runner(spec)))


if __name__ == "__main__":
    main()
