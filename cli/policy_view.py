"""How `sft`, `grpo`, `resume` and `show` print a policy training run: the
model and data, the policy's score on val at each validation (per
category), the last metrics TRL logged, the evolutions of the bank, the
checkpoints, and the teacher's calls and cost."""

from __future__ import annotations

from typing import Any

from skillstate.cli.tables import Col, clip, fmt, table_lines, wrapped


def policy_text(s: dict[str, Any], width: int) -> list[str]:
    from skillstate.cli.render import cost_lines, failure_lines, usage_lines

    p = s["policy"]
    lora = p["trainer"].get("lora")
    how = f"LoRA r{lora['r']}" if lora else "every weight"
    speed = f", {p['seconds_per_step']:.2f} s/step" if p.get("seconds_per_step") else ""
    lines = wrapped(f"policy run {clip(s['run_id'], max(width - 12, 8))}: {s['status']}; {p['method']} of "
                    f"{p['base_model']['path']} ({how}), {p['steps']}/{p['max_steps']} steps{speed}", width)
    data = f"{p['dataset']['rows']} demonstrations" if p["method"] == "sft" else "prompts built from the bank"
    lines.extend(wrapped(f"from run {p['source_run']}: {data}; base model sha256 {p['base_model']['sha256'][:12]}",
                         width))
    if p["validations"]:
        categories = sorted({c for v in p["validations"] for c in v["by_task_type"]})
        lines.append("")
        cols = [Col("step", num=True), Col("val", num=True)] + [Col(c, num=True, shrink=True) for c in categories]
        rows = [[v["step"], fmt(v["score"])] + [fmt(v["by_task_type"].get(c)) for c in categories]
                for v in p["validations"]]
        lines.extend(table_lines(cols, rows, width))
    if p["last_metrics"]:
        lines.append("")
        lines.extend(wrapped("last logged: " + ", ".join(f"{k} {v:.4g}" for k, v in p["last_metrics"].items()),
                             width))
    for e in p["evolutions"]:
        if e["status"] == "skipped":
            lines.extend(wrapped(f"step {e['step']}: no category below the evolution threshold", width))
            continue
        if e["status"] == "no_failures":
            lines.extend(wrapped(f"step {e['step']}: {', '.join(e['categories'])} below the threshold, but the "
                                 "policy failed none of the train items tried: no teacher call", width))
            continue
        gate = (f"kept, val {fmt(e['base_score'])} -> {fmt(e['candidate_score'])}" if e["accepted"] else
                f"not kept (val {fmt(e['candidate_score'])} against {fmt(e['base_score'])})"
                if e["candidate_score"] is not None else f"teacher {e['status']}, nothing added")
        lines.extend(wrapped(f"step {e['step']}: evolved {', '.join(e['categories'])}: +{e['added']} skills, {gate}",
                             width))
    if p["checkpoints"]:
        last = p["checkpoints"][-1]
        lines.extend(wrapped(f"last checkpoint: step {last['step']} at {last['path']} (sha256 "
                             f"{last['sha256'][:12]})", width))
    if s["usage"]:
        lines.append("")
        lines.extend(usage_lines(s["usage"], width))
    if s.get("cost"):
        lines.append("")
        lines.extend(cost_lines(s["cost"], width))
    lines.extend(failure_lines(s, width))
    return lines
