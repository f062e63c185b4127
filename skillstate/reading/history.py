"""Reading a run back: replay to a step, skills at a step, diffs, summaries.

Nothing here calls an LLM: everything is folded from the log. `skillstate runs`
imports this module for `status_of` alone, so what the summaries, the skill
texts and the diffs need (prices, skill trees, the readers of calls) is imported
where they are made.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from skillstate.engine.loading import LoadedRun, judged, load_run, roles_of
from skillstate.errors import NotFoundError
from skillstate.log.events import Usage
from skillstate.log.reducer import RunState, StepRecord, need, usage_totals
from skillstate.log.review_fold import awaiting
from skillstate.reading.policy_view import policy_status
from skillstate.storage.store import Store


@dataclass(frozen=True)
class Snapshot:
    run_id: str
    step: int
    state: RunState
    current_skill: str
    best_skill: str
    record: StepRecord | None

    def to_json(self) -> dict[str, Any]:
        s = self.state
        rec = self.record
        return {
            "run_id": self.run_id,
            "step": self.step,
            "epoch": rec.epoch if rec else 0,
            "current_skill": self.current_skill,
            "best_skill": self.best_skill,
            "current_score": s.current_score,
            "best_score": s.best_score,
            "best_step": s.best_step,
            "edit_budget": rec.edit_budget if rec else None,
            "decision": None if rec is None else {
                "decision": rec.decision, "candidate_score": rec.candidate_score, "reason": rec.reason},
            "baseline": s.baseline.model_dump() if s.baseline else None,
            "accepts": s.count("accept", "accept_best"),
            "rejects": s.count("reject"),
            "skips": s.count("skip"),
            "usage": {role: u.model_dump() for role, u in s.usage.items()},
        }


def replay(store: Store, run_id: str | None, to_step: int) -> Snapshot:
    """The state after `to_step` (0 = after the baseline), folded from the log."""
    from skillstate.reading.skill_text import skill_text

    loaded = load_run(store, run_id)
    state = loaded.state_at(to_step)
    return Snapshot(loaded.run_id, to_step, state, skill_text(store, need(state.current_skill, "the current skill")),
                    skill_text(store, need(state.best_skill, "the best skill")), state.record(to_step))


def skill_at(store: Store, run_id: str | None, step: int | None = None, best: bool = False) -> tuple[str, str]:
    """(run_id, skill text). With a step: the current skill after it, or the
    best one so far with `best`. Without a step: the run's best skill."""
    from skillstate.reading.skill_text import skill_text

    loaded = load_run(store, run_id)
    return loaded.run_id, skill_text(store, chosen_skill(loaded, step, best))


def chosen_skill(loaded: LoadedRun, step: int | None = None, best: bool = False) -> str:
    """The hash of the skill `skill_at` picks from a folded run."""
    state = loaded.state if step is None else loaded.state_at(step)
    h = state.best_skill if best or step is None else state.current_skill
    if h is None:
        raise NotFoundError(f"run {loaded.run_id!r} has no skill yet")
    return h


def skill_diff(store: Store, run_id: str | None, step_a: int, step_b: int) -> tuple[str, str]:
    from skillstate.reading.skill_text import stored_files
    from skillstate.skilltree import SKILL_MD

    loaded = load_run(store, run_id)
    rid = loaded.run_id
    hash_a, hash_b = chosen_skill(loaded, step_a), chosen_skill(loaded, step_b)
    tree_a, tree_b = stored_files(store, hash_a), stored_files(store, hash_b)
    if tree_a is not None or tree_b is not None:  # a run that trains the whole directory: one diff per file
        files_a, files_b = tree_a or {}, tree_b or {}
        out: list[str] = []
        for path in sorted(set(files_a) | set(files_b), key=lambda p: (p != SKILL_MD, p)):
            before, after = files_a.get(path), files_b.get(path)
            out.extend(difflib.unified_diff(
                _lines(before), _lines(after),
                fromfile=f"{rid}@step_{step_a}/{path}" if before is not None else "/dev/null",
                tofile=f"{rid}@step_{step_b}/{path}" if after is not None else "/dev/null"))
        return rid, "".join(out)
    a, b = store.get_blob(hash_a), store.get_blob(hash_b)
    # a run of a skill directory that trains its SKILL.md: the diff names the file
    in_file = f"/{SKILL_MD}" if loaded.state.skill_tree else ""
    lines = difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                 fromfile=f"{rid}@step_{step_a}{in_file}", tofile=f"{rid}@step_{step_b}{in_file}")
    return rid, "".join(lines)


def _lines(text: str | None) -> list[str]:
    return [] if text is None else text.splitlines(keepends=True)


def status_of(state: RunState) -> str:
    if not state.started:
        return "empty"
    if state.kind == "policy":
        return policy_status(state)
    if state.completed:
        return "evaluated" if state.kind == "eval" else "completed"
    if state.baseline is None:
        return "started" if state.stopped is None else "stopped before the baseline"
    if awaiting(state) is not None:  # review: a step waits for a person's decision
        return "awaiting_review"
    if state.stopped is not None:
        return f"stopped at step {state.last_completed_step}/{state.total_steps}"
    return f"step {state.last_completed_step}/{state.total_steps}"


def run_summary(store: Store, loaded: LoadedRun) -> dict[str, Any]:
    """Headline figures of a run: scores, decisions, usage, what was paid.

    Usage counts the run's own events (a fork's inherited prefix is its
    parent's); `sent` counts requests this run actually sent, the rest were
    served from the call table."""
    from skillstate.llm.embeddings import ROLE as EMBEDDER
    from skillstate.reading.failures import event_call_refs, failed_call_tokens, failed_calls, unused_calls
    from skillstate.reading.policy_view import policy_summary
    from skillstate.reading.selection_report import gap_summary
    from skillstate.reading.tool_use import tool_use
    from skillstate.reading.triggers import run_triggers, unobserved_loads

    s = loaded.state
    refs = list(event_call_refs(store, loaded.own))  # read once: each results blob holds many calls
    own = with_failed_tokens(usage_totals(e.event for e in loaded.own), failed_call_tokens(store, loaded.run_id, refs))
    sent_rows = store.paid_by_model(loaded.run_id)
    paid: dict[str, Usage] = {}
    for role, _model, calls, pt, ct in sent_rows:
        paid[role] = paid.get(role, Usage()) + Usage(calls=calls, prompt_tokens=pt, completion_tokens=ct)
    usage = {}
    unused = unused_calls(store, loaded.run_id, refs)
    for role in sorted(set(own.usage) | set(paid)):
        logical, sent = own.usage.get(role, Usage()), paid.get(role, Usage())
        if role == EMBEDDER:  # vectors are looked up by text, not referenced by events: the run's are those it sent
            logical = sent
        usage[role] = {
            "calls": logical.calls, "prompt_tokens": logical.prompt_tokens,
            "completion_tokens": logical.completion_tokens, "sent": sent.calls,
            "unused": unused.get(role, {}).get("unused", 0), "failed_unrecorded": unused.get(role, {}).get("failed", 0),
            "sent_prompt_tokens": sent.prompt_tokens, "sent_completion_tokens": sent.completion_tokens,
        }
    tests = {label: {"split": ev.split, "hard": ev.scores.hard, "soft": ev.scores.soft, "n": ev.scores.n,
                     "by_task_type": {k: v.model_dump() for k, v in ev.scores.by_task_type.items()}}
             for label, ev in s.tests.items()}
    return {
        "run_id": loaded.run_id,
        "kind": s.kind,
        "parent_run_id": s.parent_run_id,
        "fork_step": s.fork_step,
        "status": status_of(s),
        "stopped": ({"condition": s.stopped.condition, "reason": s.stopped.reason} if s.stopped else None),
        "steps": s.last_completed_step,
        "total_steps": s.total_steps,
        **({"max_calls": limit} if (limit := s.config.get("max_calls")) else {}),
        "baseline_score": s.baseline.gate if s.baseline else None,
        "current_score": s.current_score,
        "best_score": s.best_score,
        "best_step": s.best_step,
        "accepts": s.count("accept", "accept_best"),
        "new_best": s.count("accept_best"),
        "rejects": s.count("reject"),
        "skips": s.count("skip"),
        "gate_metric": s.config.get("gate_metric"),
        "test": tests,
        "val_to_test": gap_summary(s),
        "usage": usage,
        "usage_by_stage": {stage: {role: u.model_dump() for role, u in roles.items()}
                           for stage, roles in own.usage_by_stage.items()},
        "cost": cost_summary(sent_rows, dict(s.config), own, roles_of(s.kind, str(s.config.get("env", "qa")))),
        "failures": failed_calls(refs),
        "tool_use": tool_use(store, str(s.config.get("env", "qa")), refs, s.config.get("disclosure") == "tools"),
        **({"skill_tree": skill_tree_summary(store, s.skill_tree, s.initial_skill)} if s.skill_tree else {}),
        **({"triggers": triggers} if (triggers := run_triggers(store, s, loaded.lineage)) else {}),
        **({"grading": grading_summary(store, s)} if s.kind != "policy" and s.tests
           and judged(str(s.config.get("env", "qa"))) else {}),
        **({"triggers_unobserved": harness} if (harness := unobserved_loads(s.config)) else {}),
        **({"policy": policy_summary(s)} if s.policy is not None else {}),
    }


def early_rejects(loaded: LoadedRun) -> dict[int, dict[str, Any]]:
    """The steps whose gated candidate was rejected early, with what its evaluation says: `scored` of `of` items
    scored, and `upper_bound`, the most it could have scored (the gate's `candidate_score` for that step). The
    gated evaluation is a step's last (after a repair, the repaired candidate's)."""
    from skillstate.log.events import CandidateEvaluated

    gated: dict[int, Any] = {}
    for stored in loaded.lineage:
        if isinstance(stored.event, CandidateEvaluated):
            gated[stored.event.step] = stored.event.partial
    return {step: {"scored": p.scored, "of": p.of, "upper_bound": p.upper_bound}
            for step, p in gated.items() if p is not None}


def skill_tree_summary(store: Store, root: str, initial: str | None = None) -> dict[str, Any]:
    """The Agent Skills directory a run started from: its name, its files, and what the run trains (`trained`:
    SKILL.md's path, or "all" where the run trains every file, its initial skill being the tree)."""
    from skillstate.skilltree import decode_tree, is_tree_blob, parse_front_matter, skill_md_path

    tree = decode_tree(store.get_blob(root), store.get_blobs)
    md = skill_md_path(tree)
    front = parse_front_matter(tree[md].text)
    trained = "all" if initial is not None and is_tree_blob(store.get_blob(initial)) else md
    return {"name": front.fields.get("name") if front else None, "trained": trained,
            "files": [{"path": path, "size": f.size, "kind": f.kind} for path, f in tree.items()]}


def with_failed_tokens(own: RunState, extra: dict[str, dict[str, tuple[int, int]]]) -> RunState:
    """`own` (a usage-only state) with the tokens of failed calls that got a reply added, per stage and role:
    the tables then count what the call table holds and the budget counted."""
    if not extra:
        return own
    total, by_stage = dict(own.usage), {stage: dict(roles) for stage, roles in own.usage_by_stage.items()}
    for stage, roles in extra.items():
        for role, (pt, ct) in roles.items():
            add = Usage(prompt_tokens=pt, completion_tokens=ct)
            total[role] = total.get(role, Usage()) + add
            by_stage.setdefault(stage, {})[role] = by_stage.get(stage, {}).get(role, Usage()) + add
    return replace(own, usage=MappingProxyType(total),
                   usage_by_stage=MappingProxyType({k: MappingProxyType(v) for k, v in by_stage.items()}))


def grading_summary(store: Store, s: RunState) -> dict[str, Any]:
    """Env evals: each check's pass rate per test evaluation, and the judge's agreement."""
    from skillstate.reading.grading import check_rates

    return {**check_rates(store, s), "samples": (s.config.get("judge") or {}).get("samples", 1)}


def role_model(config: dict[str, Any], role: str) -> str:
    """The model a stored config names for `role` (the judge's default is the optimizer's, with backend
    openai)."""
    from skillstate.config import SIM_MODELS

    own = (config.get(role) or {}).get("model")
    if own:
        return str(own)
    if role == "judge" and config.get("backend") == "openai":
        return str((config.get("optimizer") or {}).get("model") or "")
    return SIM_MODELS[role]


def cost_summary(sent_rows: list[tuple[str, str, int, int, int]], config: dict[str, Any], own: RunState,
                 roles: tuple[str, ...] = ("target", "optimizer")) -> dict[str, Any]:
    """USD cost per role and per stage of the run's own events at list prices,
    and what the requests it actually sent (`Store.paid_by_model` rows) cost;
    the rest came from the log. Beside them, the LLM calls of each stage, of
    all stages and sent (what a budget of calls, `max_calls`, counts is all
    stages')."""
    from skillstate.pricing import cost_usd, price_for, sent_cost

    prices = config.get("prices") or {}
    models = {role: role_model(config, role) for role in roles}
    unpriced = sorted({m for m in models.values() if price_for(m, prices) is None})

    def priced(role: str, u: Usage) -> float:
        return round(cost_usd(u.prompt_tokens, u.completion_tokens, price_for(models.get(role, ""), prices)), 6)

    by_stage = {stage: {role: priced(role, u) for role, u in per_role.items()}
                for stage, per_role in own.usage_by_stage.items()}
    by_role = {role: priced(role, u) for role, u in own.usage.items()}
    paid = {role: round(c, 6) for role, c in sent_cost(sent_rows, prices).items()}
    unpriced += [model for _role, model, *_ in sent_rows if price_for(model, prices) is None and model not in unpriced]
    calls_by_stage = {stage: sum(u.calls for u in per_role.values()) for stage, per_role in own.usage_by_stage.items()}
    return {"currency": "USD", "models": models, "by_role": by_role, "by_stage": by_stage,
            "total": round(sum(by_role.values()), 6), "paid_by_role": paid, "paid": round(sum(paid.values()), 6),
            "unpriced_models": sorted(unpriced), "calls_by_stage": calls_by_stage,
            "calls": sum(u.calls for u in own.usage.values()), "paid_calls": sum(row[2] for row in sent_rows)}
