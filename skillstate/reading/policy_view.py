"""What a policy training run (kind policy) did, for people: the base model
and data, the training curves (every metric TRL logged, by step), the
checkpoints, the policy's score on val before, during and after training,
and each evolution of the bank. Pure: the run's state in, plain data out."""

from __future__ import annotations

from typing import Any

from skillstate.log.state import PolicyProgress, RunState

# The metrics the curves and the summary lead with, when TRL logged them (SFT: loss; GRPO: loss and reward).
HEADLINE = ("loss", "reward", "reward_std", "mean_token_accuracy", "entropy", "grad_norm", "learning_rate")


def curves(p: PolicyProgress) -> dict[str, list[tuple[int, float]]]:
    """Each logged metric as (step, value) points, in step order (the trainer's closing summary left out)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for trained in p.trained:
        for row in trained.metrics:
            if "train_runtime" in row:
                continue
            step = int(row.get("step", 0))
            for key, value in row.items():
                if key != "step":
                    out.setdefault(key, []).append((step, value))
    return out


def seconds_per_step(p: PolicyProgress) -> float | None:
    steps = sum(t.step_to - t.step_from for t in p.trained)
    return sum(t.seconds for t in p.trained) / steps if steps else None


def max_steps(p: PolicyProgress) -> int:
    """The steps the run trains to (TRL's max_steps), else the steps done."""
    return int(p.started.trainer_config.get("args", {}).get("max_steps", p.step))


def policy_baseline(p: PolicyProgress) -> float | None:
    """The base policy's val score: the validation at step 0, when there was one."""
    return next((v.scores.gate for v in p.validated if v.step == 0), None)


def policy_status(state: RunState) -> str:
    """A policy run's status: completed, or the steps trained of the steps to train (stopped or not)."""
    p = state.policy
    if state.completed:
        return "completed"
    if p is None:
        return "started" if state.stopped is None else "stopped before training"
    where = f"step {p.step}/{max_steps(p)}"
    return f"stopped at {where}" if state.stopped is not None else where


def policy_summary(state: RunState) -> dict[str, Any]:
    p = state.policy
    if p is None:
        return {}
    s = p.started
    lines = curves(p)
    last = {k: v[-1][1] for k, v in lines.items() if v}
    return {
        "method": s.method,
        "base_model": {"path": s.base_model.path, "sha256": s.base_model.sha256, "files": s.base_model.files},
        "source_run": s.source_run,
        "dataset": {"rows": s.dataset_rows, "sha256": s.dataset_sha256},
        "trainer": s.trainer_config,
        "libraries": s.library_versions,
        "output_dir": s.output_dir,
        "steps": p.step,
        "max_steps": max_steps(p),
        "baseline": policy_baseline(p),
        "seconds_per_step": seconds_per_step(p),
        "last_metrics": {k: last[k] for k in HEADLINE if k in last},
        "curves": {k: [[step, value] for step, value in v] for k, v in lines.items()},
        "checkpoints": [{"step": t.checkpoint.step, "path": t.checkpoint.path, "sha256": t.checkpoint.sha256}
                        for t in p.trained],
        "validations": [{"step": v.step, "split": v.split, "score": v.scores.gate, "hard": v.scores.hard,
                         "n": v.scores.n, "by_task_type": {k: x.hard for k, x in v.scores.by_task_type.items()}}
                        for v in p.validated],
        "evolutions": [{"step": e.step, "categories": e.categories, "status": e.status, "added": len(e.added),
                        "base_score": e.base_score, "candidate_score": e.candidate_score, "accepted": e.accepted}
                       for e in p.evolved],
    }
