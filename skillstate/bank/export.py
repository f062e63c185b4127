"""The system message a task gets from the bank: its retrieved skills and
the common mistakes, as markdown. The rows for weight training (SFT, GRPO)
are written from a run's log by `skillstate.exports.training_data`."""

from __future__ import annotations

from collections.abc import Sequence

from skillstate.bank.skills import BankSkill


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
