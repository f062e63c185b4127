"""The review's pure rules (`review`): which steps a person must read, the edits a rebuilt candidate keeps,
and the gate decision a person's decision implies. The engine does the I/O around them
(`skillstate.engine.review`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from skillstate.log.events_review import APPROVE, TIMEOUT_REVIEWER, GateVerdict, ReviewDecided
from skillstate.skillopt.gate import ACCEPT, ACCEPT_BEST, ACCEPTED, REJECT

MODES = ("off", "accepted", "new_best", "all")
T = TypeVar("T")


def under_review(mode: str, decision: str, changed: bool) -> bool:
    """Whether a step the gate decided `decision` waits for a person under `review: mode`. A step without a
    changed candidate (skipped, or an identical one) has nothing to read, whatever the mode."""
    if mode == "off" or not changed or decision not in (*ACCEPTED, REJECT):
        return False
    if mode == "all":
        return True
    if mode == "new_best":
        return decision == ACCEPT_BEST
    return decision in ACCEPTED  # accepted


def kept(items: Sequence[T], dropped: Sequence[int]) -> list[T]:
    """`items` without those at the indices `dropped`, in their order."""
    gone = set(dropped)
    return [x for i, x in enumerate(items) if i not in gone]


def kept_candidate(verdict: GateVerdict, decided: ReviewDecided) -> bool:
    """Whether the step keeps a candidate after the decision: a person can take away what the gate let in,
    never let in what it kept out."""
    return decided.decision == APPROVE and verdict.decision in ACCEPTED


def who(decided: ReviewDecided) -> str:
    """Who decided, as the gate's reason tells it."""
    if decided.reviewer == TIMEOUT_REVIEWER:
        return "by timeout (review_default)"
    return f"by {decided.reviewer}"


def noted(decided: ReviewDecided) -> str:
    """The reviewer's comment, as the end of the gate's reason."""
    comment = decided.comment.strip()
    return f"; comment: {comment}" if comment and decided.reviewer != TIMEOUT_REVIEWER else ""


def numbered(indices: Sequence[int]) -> str:
    """Edit indices as people read them (from 1): `2, 3`."""
    return ", ".join(str(i + 1) for i in indices)


def closing(verdict: GateVerdict, decided: ReviewDecided, rebuilt_score: float | None) -> dict:
    """The fields of the step's `GateDecided` after its review (`rebuilt_score`: the score of the candidate
    rebuilt without the dropped edits, when some were dropped). The current and best scores are those the
    gate saw: nothing changes them while a step waits."""
    base = verdict.model_dump()
    if not kept_candidate(verdict, decided):
        if verdict.decision == REJECT:
            return {**base, "reason": f"{verdict.reason}; confirmed in review {who(decided)}{noted(decided)}"}
        return {**base, "decision": REJECT, "forced": False,
                "reason": f"rejected in review {who(decided)} (the gate's verdict: {verdict.decision}, "
                          f"{verdict.reason}){noted(decided)}"}
    if not decided.dropped:
        return {**base, "reason": f"{verdict.reason}; approved in review {who(decided)}{noted(decided)}"}
    if rebuilt_score is None:
        raise ValueError("a candidate rebuilt without some edits is kept with its own score")
    score, current, best = rebuilt_score, verdict.current_score, verdict.best_score
    decision = ACCEPT_BEST if score > best else ACCEPT
    against = f"> best {best:.4f}" if score > best else f"{'>' if score > current else '<='} current {current:.4f}"
    return {**base, "decision": decision, "candidate_score": score, "forced": score <= current,
            "paired": None, "type_guard": None,
            "reason": f"approved in review {who(decided)} without edit{'s' * (len(decided.dropped) > 1)} "
                      f"{numbered(decided.dropped)}: the rebuilt candidate scores {score:.4f} {against} "
                      f"(the gate's verdict on the whole candidate: {verdict.decision}, {verdict.reason})"
                      f"{noted(decided)}"}
