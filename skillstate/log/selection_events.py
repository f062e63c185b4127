"""The events of the final selection (`final_selection.enabled`): each top
accepted skill re-scored on the held-out selection split, then the pick.
Registered in `skillstate.log.event_codec` with the others."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from skillstate.log.events import Event
from skillstate.log.values import Frozen, Scores, Usage


class Candidate(Frozen):
    """A candidate for the final skill, as the pick saw it."""

    skill: str
    step: int
    val_score: float
    selection_score: float


class SelectionScored(Event):
    """One candidate for the final skill, scored on the selection split."""

    type: ClassVar[str] = "SelectionScored"
    rank: int  # its place among the candidates: 0 is the best on val
    skill: str
    # the step that made it the current skill (0: the initial skill); not `step`, which would file this
    # end-of-run event under that step (its page, its cost)
    from_step: int
    val_score: float  # its gate score on val, as the gate saw it
    split: str
    scores: Scores
    cached: bool = False  # served from the score cache: no results, no calls
    results: str | None = None  # blob: JSON list of ItemResult
    usage_by_role: dict[str, Usage] = Field(default_factory=dict)

    def blob_refs(self) -> list[str]:
        return [self.skill, *([self.results] if self.results else [])]

    def usage(self) -> dict[str, Usage]:
        return self.usage_by_role


class FinalSelected(Event):
    """The run's final (best) skill: the candidate best on the selection split
    (on a tie the one ranked first, so the best on val). `candidates` holds each
    one's (skill, step, val score, selection score) by rank."""

    type: ClassVar[str] = "FinalSelected"
    split: str
    chosen: int  # rank of the pick
    skill: str
    from_step: int
    val_score: float
    selection_score: float
    best_val: float  # the best-on-val skill's val score (rank 0)
    candidates: list[Candidate]
    reason: str

    def blob_refs(self) -> list[str]:
        return [self.skill, *(c.skill for c in self.candidates)]
