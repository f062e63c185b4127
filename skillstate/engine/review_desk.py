"""Deciding a review: the one way a `ReviewDecided` enters a log, for the CLI, the dashboard and the
timeout alike.

A decision is checked against the run as its log stands (the run waits, on this step, and the decision is
one the request allows), then appended right after the event it was checked against. It takes no lease: a
driver waiting out `review_timeout` holds the run's lease and must see it. The store's append check
(`Store.append` after the last sequence number read) makes the race safe: of two reviewers deciding the
same step at once, or a reviewer and the timeout, exactly one decision is recorded and the other is told
whose it was (`ReviewTaken`). Nothing is appended when a decision is refused."""

from __future__ import annotations

import datetime as dt
import getpass
import os
from collections.abc import Sequence
from dataclasses import dataclass

from skillstate.engine.loading import LoadedRun, config_of, load_run
from skillstate.errors import ConcurrencyError, CorruptLogError, UserError
from skillstate.log.events_review import DECISIONS, TIMEOUT_REVIEWER, ReviewDecided, ReviewRequested
from skillstate.log.review_fold import awaiting, decision_problem
from skillstate.skillopt import review as rules
from skillstate.skilltree import decode_tree, is_tree_blob
from skillstate.skilltree.bundle import bundle
from skillstate.storage.chain import check_chain
from skillstate.storage.store import Store, StoredEvent

REVIEWER_ENV = "SKILLSTATE_REVIEWER"
MAX_REVIEWER_CHARS = 100
MAX_COMMENT_CHARS = 4000


class ReviewTaken(UserError):
    """The step was decided (or the run changed) between reading it and recording this decision."""


@dataclass(frozen=True)
class Waiting:
    """A run that waits for a review: its folded log, the request and the event that recorded it."""

    loaded: LoadedRun
    request: ReviewRequested
    stored: StoredEvent


def reviewer_name(given: str | None = None) -> str:
    """Who decides: `given` (--reviewer), else $SKILLSTATE_REVIEWER, else the OS user; checked."""
    name = given if given is not None else os.environ.get(REVIEWER_ENV) or _os_user()
    name = name.strip()
    if not name or len(name) > MAX_REVIEWER_CHARS or not name.isprintable():
        raise UserError(f"a reviewer's name is 1 to {MAX_REVIEWER_CHARS} printable characters, got {name!r} "
                        f"(set --reviewer or ${REVIEWER_ENV})")
    if name == TIMEOUT_REVIEWER:
        raise UserError(f"the reviewer {TIMEOUT_REVIEWER!r} is the review_timeout's; give your own name")
    return name


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container): the caller says how to give one
        return ""


def waiting(store: Store, run_id: str | None, loaded: LoadedRun | None = None) -> Waiting:
    """The run `run_id` as it waits for a review (`UserError` when it does not)."""
    loaded = loaded or load_run(store, run_id)
    request = awaiting(loaded.state)
    if request is None:
        last = last_decision(loaded)
        decided = loaded.state.progress is not None and loaded.state.progress.review_decision is not None
        done = (f"; its last review, of step {last.step}, was decided by {last.reviewer} ({last.decision})"
                if last is not None and not decided else "")
        raise UserError(f"run {loaded.run_id} is not waiting for a review ({where(loaded)}{done}); nothing was "
                        "recorded")
    stored = next(s for s in reversed(loaded.lineage) if s.type == ReviewRequested.type and s.step == request.step)
    return Waiting(loaded, request, stored)


def where(loaded: LoadedRun) -> str:
    """Where a run that waits for no review stands, in a few words."""
    state = loaded.state
    if state.kind != "train":
        return f"it is {'an evaluation run' if state.kind == 'eval' else 'not a training run'}"
    if state.completed:
        return "it is completed"
    p = state.progress
    if p is not None and p.review_decision is not None:
        d = p.review_decision
        return (f"step {p.step} was decided by {d.reviewer} ({d.decision}) at {d.at}: `skillstate resume` goes on "
                "from it")
    if p is not None:
        return f"it is in step {p.step}"
    return f"its last completed step is {state.last_completed_step}"


def last_decision(loaded: LoadedRun) -> ReviewDecided | None:
    for s in reversed(loaded.lineage):
        if s.type == ReviewDecided.type:
            event = s.event
            assert isinstance(event, ReviewDecided)
            return event
    return None


def stage_text(store: Store, skill: str) -> str:
    """A stored skill as the engine patches it (a trained directory as its bundle)."""
    text = store.get_blob(skill)
    return bundle(decode_tree(text, store.get_blobs)) if is_tree_blob(text) else text


def check_drops(store: Store, w: Waiting, dropped: list[int]) -> None:
    """A drop must change the candidate and leave something of it (else: approve it whole, or reject)."""
    from skillstate.engine.review import rebuild

    if not dropped:
        return
    config = config_of(w.loaded.state)
    base = stage_text(store, w.request.base_skill)
    text = rebuild(config, base, w.request, dropped)[0]
    listed = rules.numbered(dropped)
    if text == stage_text(store, w.request.candidate):
        raise UserError(f"leaving out edit {listed} changes nothing in the candidate (it did not apply): approve "
                        "the step as it is; nothing was recorded")
    if text == base:
        raise UserError(f"leaving out edit {listed} leaves the skill as it was: reject the step instead; nothing "
                        "was recorded")


def decide(store: Store, run_id: str | None, decision: str, *, step: int | None = None, dropped: Sequence[int] = (),
           comment: str = "", reviewer: str | None = None, now: dt.datetime | None = None) -> StoredEvent:
    """Record a person's decision on the step run `run_id` waits on: `approve` (keep the gate's verdict;
    with `dropped`, indices into the request's edits, keep the candidate rebuilt without them) or `reject`.
    With `step`, the step the reviewer read: another step waiting is refused. Returns the stored event."""
    who = reviewer_name(reviewer)
    if decision not in DECISIONS:
        raise UserError(f"a decision is one of {', '.join(DECISIONS)}, got {decision!r}")
    if len(comment) > MAX_COMMENT_CHARS:
        raise UserError(f"a review comment is at most {MAX_COMMENT_CHARS} characters, got {len(comment)}")
    w = waiting(store, run_id)
    run = w.loaded.run_id
    if step is not None and step != w.request.step:
        raise UserError(f"run {run} waits for a review of step {w.request.step}, not step {step}; nothing was "
                        "recorded")
    event = ReviewDecided(step=w.request.step, candidate=w.request.candidate, decision=decision,
                          dropped=sorted(set(dropped)), reviewer=who, comment=comment.strip(),
                          at=(now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds"))
    if len(event.dropped) != len(list(dropped)):
        raise UserError("an edit is listed twice to drop; nothing was recorded")
    problem = decision_problem(w.request, event)
    if problem:
        raise UserError(f"run {run}, step {w.request.step}: {problem}; nothing was recorded")
    check_drops(store, w, event.dropped)
    return record(store, w.loaded, event)


def record(store: Store, loaded: LoadedRun, event: ReviewDecided) -> StoredEvent:
    """Append `event` right after the log as `loaded` read it, or tell who got in first."""
    last = loaded.own[-1]
    try:
        return store.append(loaded.run_id, [event], last_seq=last.seq, last_hash=last.hash)[0]
    except ConcurrencyError:
        pass
    now = load_run(store, loaded.run_id)
    mine = now.state.progress
    taken = mine.review_decision if mine is not None and mine.step == event.step else None
    if taken is None:
        taken = next((s.event for s in reversed(now.own[len(loaded.own):]) if isinstance(s.event, ReviewDecided)
                      and s.event.step == event.step), None)
    if isinstance(taken, ReviewDecided):
        without = f" without edit {rules.numbered(taken.dropped)}" if taken.dropped else ""
        raise ReviewTaken(f"step {event.step} of run {loaded.run_id} was decided meanwhile by {taken.reviewer} "
                          f"({taken.decision}{without}, at {taken.at}); your decision was not recorded") from None
    raise ReviewTaken(f"run {loaded.run_id} changed while you decided; your decision was not recorded: read it "
                      "again and decide") from None


def decision_after(store: Store, run_id: str, seq: int, last_hash: str,
                   request: ReviewRequested) -> StoredEvent | None:
    """The decision on `request` another process appended after `seq` (None: none yet). Anything else there
    means another writer drove the run meanwhile."""
    new = store.read_events(run_id, after=seq)
    if not new:
        return None
    decoded, problem = check_chain(new, last_hash, key=store.audit_key, first_seq=seq + 1)
    if problem:
        raise CorruptLogError(f"{problem}; the log of run {run_id} is damaged")
    first = decoded[0]
    if (len(new) > 1 or not isinstance(first, ReviewDecided) or decision_problem(request, first) is not None):
        raise ConcurrencyError(f"run {run_id}: {new[0].type} was appended by another writer while this driver "
                               "waited for a review")
    return new[0]
