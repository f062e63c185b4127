"""A person in the loop (`review`): the step a person must read before it is kept, and their decision.

`ReviewRequested` is the engine's: the gate has decided a step that falls under `review`, and instead of
its `GateDecided` the run records what a reviewer reads (the candidate, its diff per file, its scores and
those of the current skill per task type, the gate's verdict, the edits that built it) and waits.
`ReviewDecided` is the reviewer's (or the timeout's): appended by whoever decides, under the store's append
check, so two reviewers racing on one step record one decision. It is an input like the run's first event:
verify takes the recorded one. The step then ends with the `GateDecided` the decision implies
(`skillstate.engine.review`). Registered with the others in `skillstate.log.event_codec`."""

from __future__ import annotations

from typing import ClassVar

from skillstate.log.events import Edit, Event, PairedTest, PartialEval, Scores, TypeGuard
from skillstate.log.values import Frozen

APPROVE, REJECT = "approve", "reject"
DECISIONS = (APPROVE, REJECT)
# The reviewer a `review_timeout` decision is recorded by; no person may take the name.
TIMEOUT_REVIEWER = "timeout"


class GateVerdict(Frozen):
    """What the automatic gate decided for the step (the fields of the `GateDecided` it would have recorded)."""

    decision: str  # accept_best | accept | reject
    candidate_score: float | None
    current_score: float
    best_score: float
    reason: str = ""
    forced: bool = False
    rule: str = "strict"
    paired: PairedTest | None = None
    type_guard: TypeGuard | None = None


class ReviewEdit(Frozen):
    """One edit the candidate applies, in the order it applies them."""

    edit: Edit
    # selected | trimmed (the repair kept it without a clause) | blocker (the blocker search's removal) |
    # screened (an edit the screen left out, put back alone by the blocker search: blocker_screened)
    origin: str
    index: int | None = None  # into the step's selected edits (EditsSelected.edits); None for the search's
    status: str | None = None  # how it applied (the candidate's apply report): applied, appended, unchanged, ...


class TypeScore(Frozen):
    """The candidate and the current skill on one task type of the split the gate scored."""

    task_type: str
    candidate: float | None  # gate metric on the type's items (None: the candidate has none scored)
    current: float | None
    n: int  # the candidate's items of the type scored


class ReviewRequested(Event):
    """The step awaits a person: nothing after it runs until a `ReviewDecided` answers it."""

    type: ClassVar[str] = "ReviewRequested"
    step: int
    review: str  # the config's `review` the step fell under: accepted | new_best | all
    base_skill: str  # the skill the step built on (blob)
    candidate: str  # the candidate skill (blob)
    diff: str  # blob: JSON list of {"path", "diff"}, one unified diff per changed file, SKILL.md first
    verdict: GateVerdict
    split: str
    scores: Scores  # the candidate's on `split` (of the items scored when `partial`)
    partial: PartialEval | None = None  # rejected early: `scores` cover some items only
    current_scores: Scores | None = None  # the current skill's on `split`, when the log holds them
    types: list[TypeScore] = []
    edits: list[ReviewEdit] = []  # the edits the candidate applies (update_mode patch)
    droppable: bool = False  # the candidate is those edits applied to the base: a reviewer may leave some out

    def blob_refs(self) -> list[str]:
        return [self.base_skill, self.candidate, self.diff]


class ReviewDecided(Event):
    """A reviewer's decision on the step `ReviewRequested` put before them. `approve` keeps the gate's
    verdict (and, with `dropped`, keeps the candidate rebuilt without those edits); `reject` keeps the current
    skill. `dropped` indexes `ReviewRequested.edits`. `at` is when it was decided (ISO 8601, UTC)."""

    type: ClassVar[str] = "ReviewDecided"
    step: int
    candidate: str  # the candidate the reviewer read (ReviewRequested.candidate)
    decision: str  # approve | reject
    dropped: list[int] = []
    reviewer: str  # a person's name, or "timeout" (review_timeout ran out: review_default decided)
    at: str
    comment: str = ""
