"""Rows for weight training with TRL (skillstate itself trains no weights).

Formats followed (TRL docs, "Dataset formats and types",
https://huggingface.co/docs/trl/dataset_formats, and "GRPO Trainer",
https://huggingface.co/docs/trl/grpo_trainer):

- SFT: the *conversational language-modeling* type, one `messages` column of
  `{"role", "content"}` dicts, which SFTTrainer loads as is. The retrieved
  skills are the system message; the trajectory's observations are the user
  turns and its actions the assistant turns.
- GRPO: the *conversational prompt-only* type, a `prompt` column holding a
  list of messages, which is what GRPOTrainer samples from. GRPOTrainer hands
  every other column to the reward functions as a keyword argument, next to
  its own `prompts`, `completions`, `completion_ids` and `trainer_state`; so
  the recorded samples go in `sampled_completions` (a column named
  `completions` would clash with that argument), with `rewards` and the
  group-relative `advantages`, plus `task_id` and `category`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from skillstate.bank.advantages import group_advantages
from skillstate.bank.skills import BankSkill
from skillstate.bank.trajectories import Trajectory

Message = dict[str, str]

# Keyword arguments GRPOTrainer passes to reward functions itself: an export
# column with one of these names would make the call fail.
TRL_REWARD_KWARGS = frozenset({"prompts", "completions", "completion_ids", "trainer_state"})
GRPO_COLUMNS = ("prompt", "task_id", "category", "sampled_completions", "rewards", "advantages")


def render_skills(skills: Sequence[BankSkill], mistakes: Sequence[str] = ()) -> str:
    """The system message: the skills as a markdown list, then the mistakes to
    avoid. Empty when both are empty."""
    sections: list[str] = []
    if skills:
        lines = ["# Skills for this task", ""]
        for skill in skills:
            lines.append(f"- **{skill.title.strip()}**: {skill.principle.strip()}")
            if skill.when_to_apply.strip():
                lines.append(f"  When to apply: {skill.when_to_apply.strip()}")
        sections.append("\n".join(lines))
    if mistakes:
        sections.append("\n".join(["# Common mistakes to avoid", "", *(f"- {m}" for m in mistakes)]))
    return "\n\n".join(sections)


def _system(skills: Sequence[BankSkill], mistakes: Sequence[str]) -> list[Message]:
    text = render_skills(skills, mistakes)
    return [{"role": "system", "content": text}] if text else []


def sft_messages(trajectory: Trajectory, skills: Sequence[BankSkill], mistakes: Sequence[str] = ()) -> list[Message]:
    """One demonstration: system (skills), then per step the observation as a
    user turn (the first one led by the task) and the action as the assistant
    turn."""
    messages = _system(skills, mistakes)
    for n, step in enumerate(trajectory.ordered_steps()):
        user = step.observation
        if n == 0:
            user = "\n\n".join(p for p in (trajectory.task_description, step.observation) if p.strip())
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": step.action})
    return messages


def sft_rows(
    trajectories: Iterable[Trajectory],
    skills_for: Callable[[Trajectory], Sequence[BankSkill]],
    mistakes: Sequence[str] = (),
    successes_only: bool = True,
) -> list[dict[str, Any]]:
    """`{"messages": [...]}` rows, one per (successful) trajectory with at
    least one step, in input order; `skills_for` gives each one's retrieved
    skills."""
    rows: list[dict[str, Any]] = []
    for trajectory in trajectories:
        if (successes_only and not trajectory.success) or not trajectory.steps:
            continue
        rows.append({"messages": sft_messages(trajectory, skills_for(trajectory), mistakes)})
    return rows


class SampledGroup(BaseModel):
    """The G sampled completions of one prompt and their rewards."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    task_description: str
    category: str | None = None
    skills: list[BankSkill] = Field(default_factory=list)
    completions: list[str] = Field(min_length=1)
    rewards: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _paired(self) -> SampledGroup:
        if len(self.completions) != len(self.rewards):
            raise ValueError("a group needs one reward per completion")
        if any(not math.isfinite(r) for r in self.rewards):
            raise ValueError("rewards must be finite numbers")
        return self


def grpo_rows(groups: Iterable[SampledGroup], mistakes: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per group, with the columns of `GRPO_COLUMNS` (see the module
    docstring); `advantages` are `group_advantages(rewards)`."""
    rows: list[dict[str, Any]] = []
    for group in groups:
        prompt = [*_system(group.skills, mistakes), {"role": "user", "content": group.task_description}]
        rows.append(
            {
                "prompt": prompt,
                "task_id": group.task_id,
                "category": group.category or "",
                "sampled_completions": list(group.completions),
                "rewards": [float(r) for r in group.rewards],
                "advantages": group_advantages(group.rewards),
            }
        )
    return rows
