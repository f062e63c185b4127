"""A policy training run (kind policy: `skillstate sft`, `skillstate grpo`) in
MLflow, for `skillstate.exports.mlflow_export` (what both share is in
`mlflow_common`):

- metrics, each at its optimizer step: every metric TRL logged
  (`PolicyTrained.metrics`) as `train/NAME` (`train/loss`, `train/reward`,
  `train/learning_rate`, ...; MLflow's forbidden characters replaced by `_`),
  each validation of the policy as `val/gate`, `val/hard`, `val/soft` and
  `val/by_task_type.CATEGORY`, each evolution of the bank as
  `evolution/added`, `evolution/accepted` (1 or 0), `evolution/base_score`
  and `evolution/candidate_score`, and the summary `final.steps`,
  `final.best_score`, `final.best_step`, `final.seconds_per_step`;
- params: the run's config (as a skill run's), and `method`,
  `base_model.path`, `base_model.sha256`, `base_model.files`, `source_run`,
  `dataset.rows`, `dataset.sha256`, `output_dir`, the trainer's settings
  flattened (`trainer.args.max_steps`, `trainer.lora.r`, ...) and
  `libraries.torch` and the others;
- artifacts: `checkpoints.json` (each checkpoint's step, path and SHA-256:
  the weights are not uploaded) and `policy.json` (the run as `show --json`
  summarises it, its curves included);
- tags: a skill run's, and `skillstate.method`,
  `skillstate.base_model_sha256`, `skillstate.last_checkpoint`.

Exporting again appends only the events logged after the head recorded at
the last export.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from skillstate.exports.mlflow_common import (
    HEAD_TAG,
    RUN_ID_TAG,
    STEPS_TAG,
    TAG,
    config_params,
    epoch_ms,
    metric_key,
    run_status,
)
from skillstate.log.events_policy import PolicyBankEvolved, PolicyTrained, PolicyValidated


def policy_params(summary: dict[str, Any]) -> dict[str, Any]:
    """What the policy was trained from and how, as a nested dict for `config_params` to flatten."""
    return {"method": summary["method"], "base_model": summary["base_model"], "source_run": summary["source_run"],
            "dataset": summary["dataset"], "output_dir": summary["output_dir"], "trainer": summary["trainer"],
            "libraries": summary["libraries"]}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def event_metrics(stored: list[Any]) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp in ms, step) of each policy event in `stored` (the run's own stored events)."""
    out: list[tuple[str, float, int, int]] = []
    seen: set[tuple[str, int]] = set()

    def put(name: str, value: Any, when: int, step: int) -> None:
        number = _number(value)
        if number is not None and (name, step) not in seen:  # TRL's closing row repeats the epoch at its step
            seen.add((name, step))
            out.append((metric_key(name), number, when, step))

    for s in stored:
        e, when = s.event, epoch_ms(s.created_at)
        if isinstance(e, PolicyTrained):
            for row in e.metrics:
                step = int(row.get("step", e.step_to))
                for name, value in row.items():
                    if name != "step":
                        put(f"train/{name}", value, when, step)
            put("train/seconds_per_step", e.seconds / max(e.step_to - e.step_from, 1), when, e.step_to)
        elif isinstance(e, PolicyValidated):
            for name in ("gate", "hard", "soft"):
                put(f"val/{name}", getattr(e.scores, name), when, e.step)
            for category, scores in e.scores.by_task_type.items():
                put(f"val/by_task_type.{category}", scores.hard, when, e.step)
        elif isinstance(e, PolicyBankEvolved):
            put("evolution/added", len(e.added), when, e.step)
            put("evolution/accepted", 1 if e.accepted else 0, when, e.step)
            put("evolution/base_score", e.base_score, when, e.step)
            put("evolution/candidate_score", e.candidate_score, when, e.step)
    return out


def summary_metrics(summary: dict[str, Any], state: Any) -> dict[str, float]:
    out = {"final.steps": _number(summary["steps"]), "final.best_score": _number(state.best_score),
           "final.best_step": _number(state.best_step), "final.seconds_per_step": _number(summary["seconds_per_step"])}
    return {k: v for k, v in out.items() if v is not None}


def policy_tags(summary: dict[str, Any]) -> dict[str, str]:
    last = summary["checkpoints"][-1] if summary["checkpoints"] else None
    return {"skillstate.method": summary["method"], "skillstate.base_model_sha256": summary["base_model"]["sha256"],
            "skillstate.last_checkpoint": f"step {last['step']}: {last['path']} ({last['sha256']})" if last else ""}


def log_policy_artifacts(client: Any, mlflow_run_id: str, summary: dict[str, Any]) -> int:
    """`checkpoints.json` and `policy.json`; the number of files."""
    with tempfile.TemporaryDirectory(prefix="skillstate-mlflow-") as tmp:
        root = Path(tmp)
        (root / "checkpoints.json").write_text(json.dumps(summary["checkpoints"], indent=1), encoding="utf-8")
        (root / "policy.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False, default=str),
                                          encoding="utf-8")
        client.log_artifacts(mlflow_run_id, str(root))
    return 2


def export_policy(exporter: Any, loaded: Any) -> dict[str, Any]:
    """Export a policy run through `exporter` (`mlflow_export`'s): its MLflow run created, or the events since
    the recorded head appended, or left unchanged."""
    from mlflow.entities import Metric

    from skillstate.reading.policy_view import policy_summary

    state = loaded.state
    summary = policy_summary(state)
    seq, last_hash = loaded.log_position
    head = f"{seq}:{last_hash}"
    status, mlflow_status = run_status(state)
    existing = exporter.find(loaded.run_id)
    result: dict[str, Any] = {"run_id": loaded.run_id, "head": head, "status": status,
                              "parent_mlflow_run_id": None, "steps_logged": 0, "metrics_logged": 0,
                              "params_logged": 0, "artifacts_logged": 0, "exported_steps": summary.get("steps", 0)}
    if existing is not None:
        exporter.check_same_log(existing, loaded)
        if existing.data.tags.get(HEAD_TAG) == head:
            return {**result, "mlflow_run_id": existing.info.run_id, "action": "unchanged"}
    last_ms = epoch_ms(loaded.own[-1].created_at if loaded.own else None)
    params = {**config_params(dict(state.config), exporter.param_limit),
              **config_params(policy_params(summary), exporter.param_limit)} if summary else {}
    if existing is None:
        run = exporter.client.create_run(exporter.experiment_id, start_time=epoch_ms(loaded.own[0].created_at),
                                         run_name=loaded.run_id, tags={RUN_ID_TAG: loaded.run_id})
        mlflow_run_id, done_seq, logged, action = run.info.run_id, 0, {}, "created"
    else:
        mlflow_run_id, action = existing.info.run_id, "updated"
        done_seq = int(existing.data.tags.get(HEAD_TAG, "0:").partition(":")[0] or 0)
        logged = dict(existing.data.metrics)
        params = {k: v for k, v in params.items() if k not in existing.data.params}
    new = [s for s in loaded.own if s.seq > done_seq]
    metrics = [Metric(k, v, when, step) for k, v, when, step in event_metrics(new)]
    final = summary_metrics(summary, state) if summary else {}
    metrics += [Metric(k, v, last_ms, summary["steps"]) for k, v in final.items() if logged.get(k) != v]
    tags = {RUN_ID_TAG: loaded.run_id, f"{TAG}kind": state.kind, f"{TAG}status": status, HEAD_TAG: head,
            f"{TAG}database": exporter.store.display_url, STEPS_TAG: str(summary.get("steps", 0)),
            f"{TAG}gate_metric": str(state.config.get("gate_metric")),
            **(policy_tags(summary) if summary else {}),
            "mlflow.note.content": _note(exporter.store.display_url, loaded.run_id, summary, status)}
    exporter.log(mlflow_run_id, metrics, params, tags)
    artifacts = log_policy_artifacts(exporter.client, mlflow_run_id, summary) if summary else 0
    if mlflow_status == "RUNNING":
        exporter.client.update_run(mlflow_run_id, status="RUNNING")
    else:
        exporter.client.set_terminated(mlflow_run_id, status=mlflow_status, end_time=last_ms)
    steps = sum(t.event.step_to - t.event.step_from for t in new if t.type == "PolicyTrained")
    return {**result, "mlflow_run_id": mlflow_run_id, "action": action, "steps_logged": steps,
            "metrics_logged": len(metrics), "params_logged": len(params), "artifacts_logged": artifacts}


def _note(database: str, run_id: str, summary: dict[str, Any], status: str) -> str:
    if not summary:
        return f"skillstate policy run `{run_id}` ({status}) from {database}: not started."
    model = summary["base_model"]
    return (f"skillstate policy run `{run_id}` ({summary['method']}, {status}) from {database}.\n\n"
            f"Base model {model['path']} (sha256 {model['sha256'][:12]}), trained from run "
            f"`{summary['source_run']}`: {summary['steps']}/{summary['max_steps']} steps. The checkpoints' paths "
            "and hashes are in checkpoints.json (the weights are not uploaded).")
