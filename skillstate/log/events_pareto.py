"""The parent selection's event (`parent_selection: pareto`): which skill a
step builds on, drawn from the front of the skills accepted so far.
Registered with the others in `skillstate.log.event_codec`."""

from __future__ import annotations

from typing import ClassVar

from skillstate.log.events import Event
from skillstate.log.values import Frozen


class FrontMember(Frozen):
    """A skill on the front: it leads `types` on validation."""

    skill: str  # blob
    score: float  # its validation gate score
    types: list[str]  # the task types it leads (ties included); parent_selection items: the val items


class ParentChosen(Event):
    """The step's parent: from here on, until the gate, it is the current
    skill (the step's rollouts, reflection and candidate start from it, and
    the gate compares the candidate with it). Appended with `StepStarted`,
    whether or not it changes the current skill."""

    type: ClassVar[str] = "ParentChosen"
    step: int
    skill: str  # the parent (blob)
    score: float  # its validation gate score: the current score until the gate
    previous_skill: str  # the current skill before the draw
    front: list[FrontMember]
    pool: int  # how many skills the draw considered
    reason: str = ""

    def blob_refs(self) -> list[str]:
        return [self.skill, self.previous_skill, *(m.skill for m in self.front)]
