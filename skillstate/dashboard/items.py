"""Per-item pages of the dashboard, as plain data: the results of a step's
rollout, one item's stored trajectory (an episode's turns, or the
conversation of a single-turn rollout), and an evaluation run's page (the
skill it scored, the split, its scores and every item's result). A
trajectory is only looked up through the run's own events, so a page never
serves a blob the run does not reference."""

from __future__ import annotations

import json
from typing import Any

from skillstate.bank.document import read_bank
from skillstate.dashboard.store_view import RunCache
from skillstate.engine.loading import LoadedRun
from skillstate.errors import NotFoundError
from skillstate.log.events import ItemResult, RolloutCompleted
from skillstate.reading.bank_diff import mistake_text
from skillstate.reading.skill_text import skill_text


def result_row(r: ItemResult) -> dict[str, Any]:
    return {"item_id": r.item_id, "task_type": r.task_type, "hard": r.hard, "soft": r.soft, "turns": r.turns,
            "fail_reason": r.fail_reason, "prediction": r.prediction, "has_trajectory": r.trajectory is not None,
            "retrieved": [x.skill_id for x in r.retrieved], "sample": r.sample}


def _rollout(loaded: LoadedRun, step: int) -> list[ItemResult]:
    return [r for s in loaded.lineage if s.step == step and isinstance(s.event, RolloutCompleted)
            for r in s.event.results]


def rollout_results(loaded: LoadedRun, step: int) -> list[dict[str, Any]]:
    """Every item a step rolled out, with its result (a link to its trajectory where one was stored)."""
    return [result_row(r) for r in _rollout(loaded, step)]


def _test_results(cache: RunCache, loaded: LoadedRun, label: str) -> list[ItemResult]:
    ev = loaded.state.tests.get(label)
    if ev is None:
        raise NotFoundError(f"run {loaded.run_id!r} has no {label} evaluation")
    return [ItemResult.model_validate(x) for x in json.loads(cache.store.get_blob(ev.results))]


def trajectory_view(stored: Any) -> dict[str, Any]:
    """A stored trajectory as what the page draws: an episode's goal and turns, a conversation's messages, or
    (any other shape) its JSON."""
    if isinstance(stored, dict) and stored.get("kind") == "episode":
        return {"kind": "episode", "goal": stored.get("goal", ""), "first": stored.get("first_observation", ""),
                "success": stored.get("success"), "score": stored.get("score"),
                "fail_reason": stored.get("fail_reason", ""),
                "turns": [{"n": t.get("turn", i + 1), "action": t.get("action", ""),
                           "observation": t.get("observation", ""), "score": t.get("score"),
                           "invalid": t.get("invalid", False)} for i, t in enumerate(stored.get("turns", []))]}
    messages = stored.get("messages") if isinstance(stored, dict) else stored
    if isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages):
        return {"kind": "messages", "messages": [
            {"role": str(m["role"]), "content": m.get("content") if isinstance(m.get("content"), str)
             else json.dumps(m.get("content"), indent=1, ensure_ascii=False),
             "extra": {k: v for k, v in m.items() if k not in ("role", "content")}} for m in messages]}
    return {"kind": "json", "text": json.dumps(stored, indent=2, ensure_ascii=False, default=str)}


def item_page(cache: RunCache, run_id: str, item_id: str, step: int | None = None,
              test: str | None = None, sample: int | None = None) -> dict[str, Any]:
    """One item's result and trajectory: of step `step`'s rollout, or of the test report `test`."""
    loaded = cache.get(run_id)
    if step is not None:
        results, where = _rollout(loaded, step), f"step {step}"
    elif test is not None:
        results, where = _test_results(cache, loaded, test), f"the {test} evaluation"
    else:
        raise NotFoundError("name the step (?step=N) or the evaluation (?test=LABEL) of the item")
    found = [r for r in results if r.item_id == item_id and (sample is None or r.sample == sample)]
    if not found:
        raise NotFoundError(f"item {item_id!r} is not in {where} of run {run_id!r}")
    r = found[0]
    stored = json.loads(cache.store.get_blob(r.trajectory)) if r.trajectory else None
    view = trajectory_view(stored) if stored is not None else None
    grading = stored.get("grading") if isinstance(stored, dict) else None  # env evals: the checks and verdicts
    return {"result": result_row(r), "where": where, "step": step, "test": test, "trajectory": view,
            "checks": (grading or {}).get("checks", []), "judge_error": (grading or {}).get("judge_error")}


def eval_page(cache: RunCache, run_id: str) -> dict[str, Any]:
    """An evaluation run (`skillstate eval`): the skill it scored, each split's scores overall and per task
    type, what it cost, and every item's result."""
    loaded = cache.get(run_id)
    s = loaded.state
    reports = []
    for label, ev in s.tests.items():
        results = _test_results(cache, loaded, label)
        reports.append({"label": label, "split": ev.split, "hard": ev.scores.hard, "soft": ev.scores.soft,
                        "gate": ev.scores.gate, "n": ev.scores.n,
                        "by_task_type": {t: v.model_dump() for t, v in sorted(ev.scores.by_task_type.items())},
                        "results": [result_row(r) for r in results]})
    blob = s.initial_skill or (next(iter(s.tests.values())).skill if s.tests else None)
    skill: dict[str, Any] = {"text": None, "bank": None}
    if blob is not None and s.config.get("mode") == "bank":
        bank = read_bank(cache.store.get_blob(blob))
        skill["bank"] = {"skills": [{"id": x.id, "title": x.title, "principle": x.principle,
                                     "category": x.category or "general"} for x in bank.skills],
                         "mistakes": [mistake_text(m) for m in bank.mistakes]}
    elif blob is not None:
        skill["text"] = skill_text(cache.store, blob)
    return {"reports": reports, "skill": skill, "skill_file": s.config.get("initial_skill")}
