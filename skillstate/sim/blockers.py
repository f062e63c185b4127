"""The sim's blocking mode (`sim.blocking`): broad lines that pin another task type low.

A real instruction can silently defeat another: a broad line ("keep answers terse; never reformat
anything") overrides a specific rule added before or after it ("list every item, comma-separated").
In the blocking mode the failure analyst, when it proposes the right rule for a failing task type,
sometimes proposes with it one such broad line, aimed at style but overriding another task type. While
the skill holds that line, the target answers the type it blocks right with the chance
`sim.block_level`, whatever else the skill holds (its own rule included). The line arrives with a rule
that lifts one type, so a step that takes both gains on the whole; the blocked type's loss is small when
it had no rule yet, and its rule, proposed later, then shows no gain.

The analysts of the blocked type rarely name the line (`SPOT_BY_ANALYST`), and the pruner now and then
takes it for a line that adds nothing (`SPOT_BY_PRUNER`)."""

from __future__ import annotations

from dataclasses import dataclass

SPOT_BY_ANALYST = 0.1  # an analyst of the blocked type's failures proposes deleting the line
SPOT_BY_PRUNER = 0.2  # the prune call names it


@dataclass(frozen=True)
class Blocker:
    """A broad line that pins `blocks` at the block level while the skill holds `key`."""

    blocks: str
    key: str
    text: str


# the bundled task types: (key, text) of the line that blocks each
LINES: dict[str, tuple[str, str]] = {
    "arithmetic": ("in the order it is written",
                   "Keep answers terse: evaluate every expression in the order it is written, never regrouping it."),
    "unit_conversion": ("never rescale", "Keep answers terse: give numbers in the units they appear in; never "
                                         "rescale them."),
    "date_reasoning": ("without counting ahead", "Keep answers terse: name the day the question mentions, without "
                                                 "counting ahead."),
    "reading": ("never quoting names", "Keep answers terse: answer from what you know, never quoting names from a "
                                       "passage."),
    "letter_counting": ("treat each word as a whole", "Keep answers terse: treat each word as a whole and never "
                                                      "take it apart."),
    "list_ordering": ("never reformat or reorder", "Keep answers terse: repeat lists exactly as given; never "
                                                   "reformat or reorder them."),
}


def blockers(task_types: list[str]) -> tuple[Blocker, ...]:
    """One blocking line per task type, in sorted order of the types; a type without a written line gets one
    that names it."""
    out = []
    for blocks in sorted(set(task_types)):
        if blocks in LINES:
            key, text = LINES[blocks]
        else:
            words = blocks.replace("_", " ").strip() or "general"
            key = f"give {words} answers at once"
            text = f"Keep answers terse: give {words} answers at once, skipping any procedure the rules describe."
        out.append(Blocker(blocks, key, text))
    return tuple(out)


def blocked(skill_lower: str, task_type: str, found: tuple[Blocker, ...]) -> bool:
    """Whether a skill (in lower case) holds a line that blocks `task_type`."""
    return any(b.blocks == task_type and b.key in skill_lower for b in found)
