"""What each dashboard page shows, as plain data folded from the log (the
templates render it, the JSON endpoints serve it). Nothing here writes."""

from __future__ import annotations

import difflib
import re
from typing import Any

from skillstate.bank.document import read_bank
from skillstate.dashboard.store_view import RunCache
from skillstate.engine.loading import LoadedRun
from skillstate.errors import CorruptLogError, NotFoundError
from skillstate.log.events import RunForked
from skillstate.log.reducer import need
from skillstate.log.state import RunState
from skillstate.pricing import sent_cost
from skillstate.reading.bank_diff import bank_diff, mistake_text
from skillstate.reading.bank_steps import step_labels
from skillstate.reading.config_summary import config_summary
from skillstate.reading.curves import run_curves
from skillstate.reading.history import status_of
from skillstate.reading.policy_view import max_steps, policy_baseline
from skillstate.reading.selection_report import gap_summary
from skillstate.reading.skill_text import skill_text, stored_files
from skillstate.reading.step_detail import step_detail
from skillstate.reading.triggers import run_triggers, unobserved_loads

# A sentence ends at . ! or ? followed by space; a line of the skill is split
# into its sentences so that each can be asked about.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def run_row(cache: RunCache, run_id: str) -> dict[str, Any]:
    """One line of the runs page (computed once per version of the run)."""
    return cache.memo(run_id, "row", lambda loaded: _row(cache, loaded))


def _row(cache: RunCache, loaded: LoadedRun) -> dict[str, Any]:
    s = loaded.state
    run_id = loaded.run_id
    sent_rows = cache.store.paid_by_model(run_id)
    paid = sent_cost(sent_rows, dict(s.config).get("prices") or {})
    best_test = s.tests.get("best") or s.tests.get("eval")
    started = loaded.own[0].created_at if loaded.own else None
    policy = _policy_row(s) if s.kind == "policy" else {}
    return {
        "run_id": run_id,
        "kind": s.kind,
        "mode": s.config.get("mode", "skill"),
        "status": status_of(s),
        "completed": s.completed,
        "parent_run_id": s.parent_run_id,
        "fork_step": s.fork_step,
        "steps": s.last_completed_step,
        "total_steps": s.total_steps,
        "baseline_score": s.baseline.gate if s.baseline else None,
        "best_score": s.best_score,
        "best_step": s.best_step,
        "test_score": best_test.scores.hard if best_test else None,
        "paid_usd": round(sum(paid.values()), 6),
        "sent_calls": sum(row[2] for row in sent_rows),
        "started": started.isoformat(timespec="seconds") if started else None,
        "version": loaded.log_position[0],
        **policy,
    }


def _policy_row(s: RunState) -> dict[str, Any]:
    """A policy training run's line: its method in place of a mode, its steps trained of max_steps, and the
    base policy's val score (at step 0) as its baseline; `bank` when it has a bank to show."""
    p = s.policy
    return {"mode": "policy", "method": p.started.method if p else None, "bank": s.config.get("mode") == "bank",
            "steps": p.step if p else 0, "total_steps": max_steps(p) if p else None,
            "baseline_score": policy_baseline(p) if p else None}


def runs_page(cache: RunCache) -> list[dict[str, Any]]:
    """Every run's line; a run whose log is damaged is listed as damaged (its own page says how), so one
    bad log never hides the others."""
    rows = []
    for r in cache.store.list_runs():
        try:
            rows.append(run_row(cache, r.run_id))
        except CorruptLogError as err:
            rows.append(_damaged_row(r, str(err)))
    return sorted(rows, key=lambda r: r["started"] or "", reverse=True)


def _damaged_row(r: Any, problem: str) -> dict[str, Any]:
    return {"run_id": r.run_id, "kind": r.kind, "mode": None, "status": "damaged", "completed": False,
            "damage": problem[:500], "parent_run_id": r.parent_run_id, "fork_step": r.fork_step, "steps": None,
            "total_steps": None, "baseline_score": None, "best_score": None, "best_step": None, "test_score": None,
            "paid_usd": None, "sent_calls": None,
            "started": r.created_at.isoformat(timespec="seconds") if r.created_at else None, "version": None}


# The steps table shows the latest steps of a long run; ?steps=all shows every one.
STEPS_SHOWN = 100


def run_page(cache: RunCache, run_id: str, all_steps: bool = False) -> dict[str, Any]:
    curves = cache.memo(run_id, "curves", run_curves)
    row = run_row(cache, run_id)
    state = cache.get(run_id).state
    failed = cache.store.failed_sent(run_id)
    steps = curves["steps"]
    bank = state.config.get("mode") == "bank"
    if bank:  # a bank step is labelled with what it did: it has no edit budget, and distilling is not a "skip"
        labels = cache.memo(run_id, "bank_labels", lambda loaded: step_labels(x.event for x in loaded.lineage))
        steps = [{**r, "bank_label": labels.get(r["step"], "in progress")} for r in steps]
    shown = steps if all_steps else steps[-STEPS_SHOWN:]
    return {
        "run": row, "curves": curves, "bank": bank, "config": config_summary(dict(state.config)),
        "stage_cost": curves["own_cost_by_stage"],
        "decisions": {"accepts": state.count("accept", "accept_best"), "rejects": state.count("reject"),
                      "skips": state.count("skip")},
        "from_log": max(curves["own_calls"] - row["sent_calls"], 0),
        "failed": {"count": sum(failed.values()), "common": max(failed, key=failed.__getitem__) if failed else None},
        "steps_shown": list(reversed(shown)), "steps_hidden": len(steps) - len(shown),
        "val_to_test": gap_summary(state),
        "triggers": cache.memo(run_id, "triggers",
                               lambda loaded: run_triggers(cache.store, loaded.state, loaded.lineage)),
        "triggers_unobserved": unobserved_loads(state.config),
    }


def _diff_rows(before: str, after: str) -> list[dict[str, str]]:
    """A line diff as rows of {kind: same|add|del|gap, text}."""
    rows: list[dict[str, str]] = []
    a, b = before.splitlines(), after.splitlines()
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(3):
        if rows:
            rows.append({"kind": "gap", "text": "…"})
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows.extend({"kind": "same", "text": line} for line in a[i1:i2])
                continue
            rows.extend({"kind": "del", "text": line} for line in a[i1:i2])
            rows.extend({"kind": "add", "text": line} for line in b[j1:j2])
    return rows


def skill_diff(before: str, after: str, files_a: dict[str, str] | None = None,
               files_b: dict[str, str] | None = None) -> dict[str, Any]:
    """The line diff of two skills; where either is a trained tree (`files_a`, `files_b`: its text files), file
    by file, each changed file under a `file` row that names it (a file created or removed diffs against
    nothing)."""
    if files_a is not None or files_b is not None:
        files_a, files_b = files_a or {}, files_b or {}
        rows: list[dict[str, str]] = []
        for path in sorted(set(files_a) | set(files_b), key=lambda p: (p != "SKILL.md", p)):
            a, b = files_a.get(path), files_b.get(path)
            if a != b:
                what = " (new)" if a is None else " (removed)" if b is None else ""
                rows += [{"kind": "file", "text": path + what}, *_diff_rows(a or "", b or "")]
    else:
        rows = _diff_rows(before, after)
    return {"rows": rows, "added": sum(r["kind"] == "add" for r in rows),
            "removed": sum(r["kind"] == "del" for r in rows)}


def _bank_of(cache: RunCache, blob: str):
    return read_bank(cache.store.get_blob(blob))


def bank_step_diff(cache: RunCache, detail: dict[str, Any]) -> dict[str, Any] | None:
    """A bank step's change: the bank before the step against the bank it built (the candidate it gated, else
    the bank after distilling)."""
    skills, distilled = detail.get("skills") or {}, detail.get("distilled") or {}
    before = distilled.get("base_skill") or skills.get("base")
    after = skills.get("candidate") or distilled.get("skill")
    if not before or not after:
        return None
    return bank_diff(_bank_of(cache, before), _bank_of(cache, after))


def step_page(cache: RunCache, run_id: str, step: int) -> dict[str, Any]:
    from skillstate.dashboard.items import rollout_results

    loaded = cache.get(run_id)
    detail = step_detail(cache.store, loaded, step)
    skills = detail.get("skills")
    diff = bank = None
    if loaded.state.config.get("mode") == "bank":
        bank = bank_step_diff(cache, detail)
    elif skills:
        # the candidate the gate took: the blocker search's, else the repaired one (repair: ablate), else the step's
        gated = skills.get("searched") or skills.get("repaired") or skills["candidate"]
        diff = skill_diff(skill_text(cache.store, skills["base"]), skill_text(cache.store, gated),
                          stored_files(cache.store, skills["base"]), stored_files(cache.store, gated))
    steps = [r.step for r in loaded.state.history]
    return {"run": run_row(cache, run_id), "detail": detail, "diff": diff, "bank_diff": bank,
            "results": rollout_results(loaded, step),
            "prev": max((s for s in steps if s < step), default=0 if loaded.state.baseline else None),
            "next": min((s for s in steps if s > step), default=None)}


def step_zero_page(cache: RunCache, run_id: str) -> dict[str, Any]:
    """Step 0: the baseline (and a seeded bank's seeding), as `skillstate show --step 0` prints it."""
    from skillstate.reading.step_zero import step_zero

    loaded = cache.get(run_id)
    steps = [r.step for r in loaded.state.history]
    return {"run": run_row(cache, run_id), "zero": step_zero(cache.store, loaded),
            "next": min(steps, default=None)}


def skill_lines(text: str) -> list[dict[str, Any]]:
    """The skill's lines, each split into sentences (the pieces one can ask
    `why` about); blank lines are kept so the layout is the document's."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        heading = stripped.startswith("#")
        pieces = [p for p in _SENTENCE_END.split(stripped)] if stripped and not heading else [stripped]
        out.append({"heading": heading, "indent": len(line) - len(line.lstrip()), "pieces": pieces})
    return out


def skill_page(cache: RunCache, run_id: str, which: str = "best") -> dict[str, Any]:
    loaded = cache.get(run_id)
    s = loaded.state
    blob = {"best": s.best_skill, "current": s.current_skill, "initial": s.initial_skill}.get(which)
    if blob is None:
        raise NotFoundError(f"run {run_id!r} has no {which} skill yet")
    text = skill_text(cache.store, blob)  # a run that trains the whole directory: every file, in blocks
    bank = s.config.get("mode") == "bank"
    files = stored_files(cache.store, blob) or {}  # a run that trains the whole directory: a section per file
    sections: list[dict[str, Any]] = [] if bank else [
        {"path": p, "lines": skill_lines(t)} for p, t in files.items()] or [{"path": None, "lines": skill_lines(text)}]
    return {"run": run_row(cache, run_id), "which": which, "text": text, "bank": bank,
            "lines": sections[0]["lines"] if sections else [], "sections": sections, "best_step": s.best_step,
            "files": skill_files(cache, s.skill_tree) if s.skill_tree and not files else []}


def skill_files(cache: RunCache, root: str) -> list[dict[str, Any]]:
    """The files of the skill directory a run started from: SKILL.md is the
    trained skill shown above them; the others, kept as read, with their text."""
    from skillstate.skilltree import decode_tree, skill_md_path

    tree = decode_tree(cache.store.get_blob(root), cache.store.get_blobs)
    trained = skill_md_path(tree)
    return [{"path": path, "size": f.size, "trained": path == trained,
             "text": None if f.is_binary or path == trained else f.text} for path, f in tree.items()]


def why(cache: RunCache, run_id: str, text: str) -> dict[str, Any]:
    """`skillstate why TEXT` for one sentence of the skill (or a bank skill's title)."""
    loaded = cache.get(run_id)
    if loaded.state.best_skill is None:
        raise NotFoundError(f"run {run_id!r} has no skill yet")
    if loaded.state.config.get("mode") == "bank":
        from skillstate.reading.bank_provenance import explain_bank

        return {"bank": True, **explain_bank(cache.store, run_id, text)}
    from skillstate.reading.provenance import explain

    return {"bank": False, **explain(cache.store, run_id, text, loaded=loaded)}


def _overrides(cache: RunCache, run_id: str) -> dict[str, Any]:
    first = cache.store.read_events(run_id)[:1]
    ev = first[0].event if first else None
    return dict(ev.overrides) if isinstance(ev, RunForked) else {}


def lineage_page(cache: RunCache, run_id: str) -> dict[str, Any]:
    """The tree of runs that `run_id` belongs to: its root and every fork
    below it, each edge with the fork step and the overrides."""
    rows = {r.run_id: r for r in cache.store.list_runs()}
    if run_id not in rows:
        raise NotFoundError(f"no run {run_id!r} in this database")
    root = run_id
    while rows[root].parent_run_id in rows:
        root = rows[root].parent_run_id  # type: ignore[assignment]
    children: dict[str, list[str]] = {}
    for r in rows.values():
        if r.parent_run_id:
            children.setdefault(r.parent_run_id, []).append(r.run_id)

    def node(rid: str) -> dict[str, Any]:
        row = run_row(cache, rid)
        kids = sorted(children.get(rid, []), key=lambda c: (rows[c].fork_step or 0, c))
        return {**row, "overrides": _overrides(cache, rid) if rows[rid].parent_run_id else {},
                "children": [node(c) for c in kids]}

    return {"run_id": run_id, "root": node(root)}


def compare_page(cache: RunCache, a: str, b: str) -> dict[str, Any]:
    runs = []
    trees = []
    bests = []
    for rid in (a, b):
        loaded = cache.get(rid)
        if loaded.state.kind == "policy":  # its curves are by training step: its own page draws them
            raise NotFoundError(f"run {rid!r} is a policy training run: compare shows skill runs (open its page)")
        best = loaded.state.best_skill
        bests.append(best if loaded.state.config.get("mode") == "bank" else None)
        runs.append({"row": run_row(cache, rid), "curves": run_curves(loaded),
                     "best": skill_text(cache.store, best) if best else ""})
        trees.append(stored_files(cache.store, best) if best else None)
    if bests[0] and bests[1]:  # two skill banks: skills added, dropped and refined, not a JSON line diff
        changes = bank_diff(_bank_of(cache, bests[0]), _bank_of(cache, bests[1]))
        return {"runs": runs, "diff": None, "bank_diff": changes}
    return {"runs": runs, "diff": skill_diff(str(runs[0]["best"]), str(runs[1]["best"]), *trees), "bank_diff": None}


def bank_page(cache: RunCache, run_id: str) -> dict[str, Any]:
    """A skill-bank run: its best bank per category, and how the bank grew
    step by step (skills per category after each step's candidate)."""
    loaded: LoadedRun = cache.get(run_id)
    s = loaded.state
    if s.config.get("mode") != "bank":
        raise NotFoundError(f"run {run_id!r} is not a skill-bank run (mode {s.config.get('mode', 'skill')})")
    store = cache.store
    bank = read_bank(store.get_blob(need(s.best_skill, "the best bank")))
    groups: dict[str, list[dict[str, Any]]] = {}
    for skill in bank.skills:
        groups.setdefault(skill.category or "general", []).append({
            "id": skill.id, "title": skill.title, "principle": skill.principle, "when": skill.when_to_apply,
            "origin": skill.provenance.origin, "step": skill.provenance.step, "refines": skill.provenance.refines,
            "trajectories": len(skill.provenance.trajectories)})
    growth = []
    start = s.start_skill
    if start:
        growth.append({"step": 0, **_counts(read_bank(store.get_blob(start)))})
    for rec in s.history:
        if rec.current_skill:
            growth.append({"step": rec.step, "decision": rec.decision,
                           **_counts(read_bank(store.get_blob(rec.current_skill)))})
    ordered = sorted(groups, key=lambda c: (c != "general", c))
    return {"run": run_row(cache, run_id), "groups": [(c, groups[c]) for c in ordered], "size": len(bank.skills),
            "mistakes": [mistake_text(m) for m in bank.mistakes], "growth": growth}


def _counts(bank) -> dict[str, Any]:
    by: dict[str, int] = {}
    for skill in bank.skills:
        key = skill.category or "general"
        by[key] = by.get(key, 0) + 1
    return {"total": len(bank.skills), "by_category": by}
