"""SFT rows from the trajectories a bank run imported (`bank.trajectories`):
SkillRL's cold start, demonstrations with the skills in context. One row per
successful trajectory with at least one step: the skills the run's best bank
gives its category (template retrieval: the category's skills and the first
`bank.general_k` general ones) and the common mistakes it would be shown
(`bank.mistakes_k`) as the system message, then per step the observation as a user turn (the first led by the
task) and the action as the assistant turn."""

from __future__ import annotations

import json
from typing import Any

from skillstate.bank.document import read_bank
from skillstate.bank.export import render_skills
from skillstate.bank.retrieval import retrieve_template
from skillstate.bank.skills import Bank
from skillstate.bank.trajectories import Trajectory
from skillstate.engine.loading import load_run
from skillstate.errors import UserError
from skillstate.storage.store import Store

Message = dict[str, str]


def trajectory_messages(trajectory: Trajectory, bank: Bank, general_k: int, mistakes_k: int = 0) -> list[Message]:
    chosen = retrieve_template(bank, trajectory.task_category, general_k)
    mistakes = [m.text for m in bank.mistakes_for(trajectory.task_category, mistakes_k)]
    system = render_skills([s for r in chosen if (s := bank.by_id(r.skill_id)) is not None], mistakes)
    messages = [{"role": "system", "content": system}] if system else []
    for n, step in enumerate(trajectory.ordered_steps()):
        user = step.observation
        if n == 0:
            user = "\n\n".join(p for p in (trajectory.task_description, step.observation) if p.strip())
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": step.action})
    return messages


def imported_sft_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """`{"messages": [...]}` rows of the run's successful imported trajectories, in the file's order."""
    loaded = load_run(store, run_id)
    state = loaded.state
    if state.config.get("mode") != "bank" or not state.trajectories:
        raise UserError(f"run {loaded.run_id!r} imported no trajectories (bank.trajectories of a bank run)")
    if state.best_skill is None:
        raise UserError(f"run {loaded.run_id!r} has no bank yet")
    bank = read_bank(store.get_blob(state.best_skill))
    general_k = int((state.config.get("bank") or {}).get("general_k", 6))
    mistakes_k = int((state.config.get("bank") or {}).get("mistakes_k", 0))
    trajectories = [Trajectory.model_validate(t) for t in json.loads(store.get_blob(state.trajectories))]
    return [{"messages": trajectory_messages(t, bank, general_k, mistakes_k)}
            for t in trajectories if t.success and t.steps]
