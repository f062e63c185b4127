"""What a policy training run's dashboard page shows (kind policy: `skillstate
sft`, `skillstate grpo`): the model and its source run, the trainer's
settings, the steps done, the curves TRL logged, the validations per
category, the evolutions of the bank and the checkpoints. Plain data folded
from the log by `skillstate.reading.policy_view`."""

from __future__ import annotations

from typing import Any

from skillstate.dashboard.store_view import RunCache
from skillstate.errors import NotFoundError
from skillstate.reading.config_summary import config_summary
from skillstate.reading.policy_view import HEADLINE, policy_summary

# Logged by TRL but not a curve worth a chart of its own (the epoch and token counts climb with the step).
NOT_CHARTED = ("epoch", "num_tokens", "step_time")


def policy_page(cache: RunCache, run_id: str) -> dict[str, Any]:
    from skillstate.dashboard.pages import run_row

    loaded = cache.get(run_id)
    if loaded.state.kind != "policy":
        raise NotFoundError(f"run {run_id!r} is not a policy training run (kind {loaded.state.kind})")
    summary = cache.memo(run_id, "policy", lambda loaded: policy_summary(loaded.state))
    curves = summary.get("curves", {})
    lead = [k for k in HEADLINE if k in curves]
    rest = sorted(k for k in curves if k not in lead and k not in NOT_CHARTED and "/" not in k)
    validations = summary.get("validations", [])
    trainer = summary.get("trainer", {})
    return {
        "run": run_row(cache, run_id), "policy": summary,
        "charts": lead + rest,  # a chart per metric, the headline ones first
        "more_metrics": sorted(k for k in curves if k not in lead and k not in rest),
        "categories": sorted({c for v in validations for c in v["by_task_type"]}),
        "args": sorted((trainer.get("args") or {}).items()),
        "lora": sorted((trainer.get("lora") or {}).items()),
        "config": config_summary(dict(loaded.state.config)),
    }
