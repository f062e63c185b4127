"""`skillstate runs`: a row per run, folded from its log. Kept apart from `render` (the summaries and the
progress lines) so that listing runs imports what folding needs and the table, nothing else."""

from __future__ import annotations

from typing import Any

from skillstate.cli.tables import Col, fmt, table_lines


def runs_lines(rows: list[dict[str, Any]], width: int | None = None) -> list[str]:
    """`skillstate runs`: one row per run; long ids are cut with an ellipsis."""
    body = [[r["run_id"], f"{r['parent_run_id']}@{r['fork_step']}" if r["parent_run_id"] else "", r["status"],
             r.get("kind") or "", fmt(r["baseline_score"]), fmt(r["best_score"]),
             "-" if r["best_step"] is None else r["best_step"]] for r in rows]
    return table_lines([Col("run", shrink=True), Col("parent", shrink=True), Col("status"), Col("kind", shrink=True),
                        Col("baseline", num=True), Col("best", num=True), Col("at", num=True)], body, width)


def _kind_label(state) -> str:
    """train (skill bank: train/bank), eval, or a policy run's method (policy/sft, policy/grpo)."""
    if state.policy is not None:
        return f"policy/{state.policy.started.method}"
    if state.kind == "train" and state.config.get("mode") == "bank":
        return "train/bank"
    return state.kind


def run_rows(store, rows) -> list[dict[str, Any]]:
    """A row per run; a run whose log is damaged is one with status `damaged` and its `problem`, so that
    one damaged log hides no other run."""
    from skillstate.engine.loading import load_run
    from skillstate.errors import CorruptLogError
    from skillstate.reading.history import status_of
    from skillstate.reading.policy_view import policy_baseline

    out: list[dict[str, Any]] = []
    for row in rows:
        try:
            state = load_run(store, row.run_id).state
        except CorruptLogError as err:
            out.append({"run_id": row.run_id, "kind": row.kind, "parent_run_id": row.parent_run_id,
                        "fork_step": row.fork_step,
                        "created_at": row.created_at.isoformat() if row.created_at else None, "status": "damaged",
                        "baseline_score": None, "best_score": None, "best_step": None, "problem": str(err)})
            continue
        baseline = state.baseline.gate if state.baseline else None
        if state.policy is not None:  # a policy run: the base policy's val score, at step 0
            baseline = policy_baseline(state.policy)
        out.append({
            "run_id": row.run_id, "kind": _kind_label(state), "parent_run_id": row.parent_run_id,
            "fork_step": row.fork_step, "created_at": row.created_at.isoformat() if row.created_at else None,
            "status": status_of(state), "baseline_score": baseline,
            "best_score": state.best_score, "best_step": state.best_step,
        })
    return out
