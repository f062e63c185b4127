"""`skillstate show --step 0`: the baseline and, for a seeded bank run, the seeding."""

from __future__ import annotations

from typing import Any

from skillstate.cli.render import failed_calls_table
from skillstate.cli.tables import clip, fmt, one_line, output_width, wrapped


def step_zero_text(d: dict[str, Any], width: int | None = None) -> str:
    width = output_width() if width is None else width

    def item(label: str, text: str) -> str:
        return clip(f"  {label}: {one_line(text)}", width)

    lines = wrapped(f"run {clip(d['run_id'], max(width - 5, 8))} step 0 (the baseline)", width)
    if "seeded" in d:
        s = d["seeded"]
        lines.extend(wrapped(f"seeded from {s['trajectories']} imported trajectories in {len(s['statuses'])} "
                             f"teacher calls ({', '.join(s['statuses']) or 'none'}): {len(s['added'])} skills "
                             f"added, {len(s['dropped'])} dropped, {len(s['mistakes'])} common mistakes", width))
        for x in s["added"]:
            lines.append(item(f"added {x['id']} ({x['category'] or 'general'})", f"{x['title']}: {x['principle']}"))
        for x in s["dropped"]:
            why = x["reason"] + (f" (like {x['similar_to']})" if x["similar_to"] else "")
            lines.append(item(f"dropped {x['id']} ({why})", x["title"]))
    b = d["baseline"]
    lines.extend(wrapped(f"baseline on {b['split']} ({b['items']} items, skill {b['skill'][:12]}): hard "
                         f"{fmt(b['hard'])} soft {fmt(b['soft'])} gate {fmt(b['gate'])}", width))
    for task_type, hard in sorted(b["by_task_type"].items()):
        lines.append(item(task_type, f"hard {fmt(hard)}"))
    if b["failures"]:
        lines.append(f"failures: {len(b['failures'])}")
        for f in b["failures"][:10]:
            lines.append(item(f["item_id"], f"{f['task_type']} {f['fail_reason']}"))
        if len(b["failures"]) > 10:
            lines.append(f"  and {len(b['failures']) - 10} more")
    calls = d.get("failed_calls") or {}
    if calls.get("by_stage"):
        lines.extend(failed_calls_table(calls["by_stage"], width, title="failed calls"))
    return "\n".join(lines)
