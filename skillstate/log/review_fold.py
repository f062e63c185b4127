"""How the review's events fold (`review`), and the rules a decision must keep to be folded at all: a
decision answers the step's request (its step and candidate), once; it drops edits only when the request
allows it, only from a candidate the gate accepted, and never all of them; and the step's `GateDecided`
after it says what the decision implies. A log that breaks them does not fold, so `audit` names it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from skillstate.errors import CorruptLogError
from skillstate.log.events import CandidateBuilt, Edit, GateDecided
from skillstate.log.events_review import APPROVE, DECISIONS, REJECT, ReviewDecided, ReviewRequested
from skillstate.log.state import RunState, StepProgress

ACCEPTED = ("accept", "accept_best")  # (skillopt.gate's, which the log does not import)


class ReviewFoldError(CorruptLogError, ValueError):
    """A review event that cannot follow the events before it."""


def awaiting(state: RunState) -> ReviewRequested | None:
    """The request the run waits on: its step's review, not decided yet; None when it waits on none."""
    p = state.progress
    if p is None or p.review is None or p.review_decision is not None:
        return None
    return p.review


def decision_problem(request: ReviewRequested, decided: ReviewDecided) -> str | None:
    """Why `decided` cannot answer `request` (None: it can)."""
    if decided.step != request.step:
        return f"it is for step {decided.step}, the request for step {request.step}"
    if decided.candidate != request.candidate:
        return "it names another candidate than the one requested"
    if decided.decision not in DECISIONS:
        return f"its decision {decided.decision!r} is none of {', '.join(DECISIONS)}"
    if not decided.reviewer.strip():
        return "it names no reviewer"
    dropped = decided.dropped
    if not dropped:
        return None
    if decided.decision != APPROVE:
        return "only an approval drops edits"
    if request.verdict.decision not in ACCEPTED:
        return "the gate kept nothing of this candidate, so there are no edits to drop"
    if not request.droppable:
        return "this candidate was not built edit by edit (its edits cannot be dropped)"
    if dropped != sorted(set(dropped)) or dropped[0] < 0 or dropped[-1] >= len(request.edits):
        return f"its dropped edits {dropped} are not distinct indices of the {len(request.edits)} edits, in order"
    if len(dropped) == len(request.edits):
        return "it drops every edit (that is a reject)"
    return None


def _count(counts: Mapping[tuple[str, str, str], int], edits: list[Edit]) -> Mapping:
    keys = {(e.keyed_op, e.target, e.content) for e in edits}
    if not keys:
        return counts
    return MappingProxyType({**counts, **{k: counts.get(k, 0) + 1 for k in keys}})


def fold_review(state: RunState, p: StepProgress, event: ReviewRequested | ReviewDecided) -> RunState:
    """Fold a review event into the step under way (`p`, already checked to be its step)."""
    if isinstance(event, ReviewRequested):
        if p.review is not None or p.candidate is None or p.candidate.skill != event.candidate:
            raise ReviewFoldError(f"ReviewRequested for step {event.step} twice, or of another candidate than "
                                  "the step's")
        return replace(state, progress=replace(p, review=event))
    if p.review is None or p.review_decision is not None:
        raise ReviewFoldError(f"ReviewDecided for step {event.step} answers no ReviewRequested (or it was "
                              "decided already)")
    problem = decision_problem(p.review, event)
    if problem:
        raise ReviewFoldError(f"ReviewDecided for step {event.step} does not answer its ReviewRequested: {problem}")
    # an edit a person left out counts as rejected, as the repair's drops do (drop_rejected_edits)
    gone = [p.review.edits[i].edit for i in event.dropped]
    return replace(state, progress=replace(p, review_decision=event),
                   rejected_edits=_count(state.rejected_edits, gone))


def reviewed(p: StepProgress | None) -> bool:
    """The step under way has its review decided (a `CandidateBuilt` now is the rebuilt candidate)."""
    return p is not None and p.review_decision is not None


def fold_rebuilt(state: RunState, p: StepProgress, event: CandidateBuilt) -> RunState:
    """The candidate rebuilt without the edits the reviewer dropped: evaluated anew, then kept."""
    decided, request = p.review_decision, p.review
    if (decided is None or request is None or p.review_rebuilt or not decided.dropped
            or decided.decision != APPROVE or request.verdict.decision not in ACCEPTED):
        raise ReviewFoldError(f"CandidateBuilt for step {event.step} after its review, which dropped no edit of a "
                              "kept candidate (or it was rebuilt already)")
    return replace(state, progress=replace(p, candidate=event, evaluation=None, review_rebuilt=True))


def check_gate(p: StepProgress, event: GateDecided) -> None:
    """A step under review ends only after its decision, with the `GateDecided` that decision implies."""
    if p.review is None:
        return
    decided = p.review_decision
    if decided is None:
        raise ReviewFoldError(f"GateDecided for step {event.step} while its review is awaited")
    kept = decided.decision == APPROVE and p.review.verdict.decision in ACCEPTED
    if kept != (event.decision in ACCEPTED):
        what = "keeps" if kept else "does not keep"
        raise ReviewFoldError(f"GateDecided {event.decision} for step {event.step}: its review "
                              f"({decided.decision} by {decided.reviewer}) {what} the candidate")
    if kept and decided.dropped and (not p.review_rebuilt or p.evaluation is None or p.evaluation.partial is not None
                                     or p.candidate is None or p.evaluation.skill != p.candidate.skill):
        raise ReviewFoldError(f"GateDecided for step {event.step} keeps a candidate its review dropped edits of "
                              "before the rebuilt candidate was scored")


__all__ = ["APPROVE", "REJECT", "ReviewFoldError", "awaiting", "check_gate", "decision_problem", "fold_rebuilt",
           "fold_review", "reviewed"]
