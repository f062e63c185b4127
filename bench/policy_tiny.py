"""Policy training end to end on a tiny random-weight model (the train extra):
a bank run on examples/qa, then `sft` and `grpo` from it, each a run of
kind policy in a fresh SQLite database.

    python bench/policy_tiny.py [--steps 20] [--threads 1]

It prints, per method: steps, seconds per step (training stretches only),
the loss (and, for GRPO, the reward) at the first and last logged step and
its mean over the last quarter, the policy's val score before and after,
the evolutions of the bank (GRPO), and the wall time of the whole run
(validations included). The model is ~100k parameters of noise with a
character tokenizer: the point is the cost of the machinery, not learning."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=5e-3, help="policy.learning_rate (a tiny random model needs more)")
    args = ap.parse_args()
    from skillstate.config import SkillConfig
    from skillstate.engine.tiny_model import write_tiny_model
    from skillstate.policy import PolicyTrainer
    from skillstate.reading.policy_view import curves
    from skillstate.storage.store import Store
    from skillstate.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = Store(f"sqlite:///{work / 'p.db'}")
        Trainer(SkillConfig(mode="bank", data=str(ROOT / "examples" / "qa"), batch_size=12, num_epochs=2, seed=42),
                store=store, run_id="bank").train()
        model = write_tiny_model(work / "tiny")
        print(f"policy training on a tiny model: {args.steps} steps, learning rate {args.lr:g}, torch threads "
              f"{args.threads}, "
              f"{time.strftime('%Y-%m-%d')}")
        print("| method | steps | s/step | loss first → last (mean of last quarter) | reward first → last "
              "(mean of last quarter) | val before → after | evolutions (kept) | wall s |")
        print("|---|---|---|---|---|---|---|---|")
        for method in ("sft", "grpo"):
            sets = {"policy.max_steps": args.steps, "policy.save_steps": max(1, args.steps // 4),
                    "policy.validation_interval": max(1, args.steps // 2), "policy.torch_threads": args.threads,
                    "policy.eval_max_new_tokens": 8, "policy.max_completion_length": 8,
                    "policy.output_dir": str(work / method), "bank.evolution_threshold": 1.0,
                    "policy.learning_rate": args.lr}
            start = time.perf_counter()
            result = PolicyTrainer(store, method, source_run="bank", base_model=str(model), overrides=sets,
                                   run_id=method).train()
            wall = time.perf_counter() - start
            p = result.state.policy
            lines = curves(p)

            def span(name: str, lines: dict = lines) -> str:
                points = [v for _, v in lines.get(name, [])]
                if not points:
                    return "-"
                tail = points[-max(1, len(points) // 4):]
                return f"{points[0]:.3f} → {points[-1]:.3f} ({statistics.fmean(tail):.3f})"

            trained = sum(t.step_to - t.step_from for t in p.trained)
            per_step = sum(t.seconds for t in p.trained) / trained
            vals = [v.scores.gate for v in p.validated]
            kept = sum(e.accepted for e in p.evolved)
            print(f"| {method} | {p.step} | {per_step:.3f} | {span('loss')} | {span('reward')} | "
                  f"{vals[0]:.3f} → {vals[-1]:.3f} | {len([e for e in p.evolved if e.status != 'skipped'])} "
                  f"({kept}) | {wall:.1f} |")
            print(f"# {method}: {len(p.trained)} checkpoints, {len(p.validated)} validations", file=sys.stderr)


if __name__ == "__main__":
    main()
