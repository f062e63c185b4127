"""A person in the loop (`review`): the stages of a step that waits for a reviewer, and the driving around
the wait.

The step's gate (`gate`) decides as always; when the step falls under `review`, it records
`ReviewRequested` instead of its `GateDecided`, and the step waits (`await_review`): the driver stops with
`ReviewPending` (the CLI's exit code 5), or with `review_timeout` stays up and polls the log for a decision
until the time runs out, then records `review_default` as decided by `timeout` (`drive_reviewed`). A
decision (`ReviewDecided`, from `skillstate.engine.review_desk`) is an input like the run's first event:
`replay --verify` takes the recorded one. After it the step ends: an approval keeps the gate's verdict, a
reject keeps the current skill, and an approval that drops edits rebuilds the candidate without them
(`review_rebuild`, the same patch the update stage applies), scores it on the split the gate scored
(`review_evaluate`) and keeps it (`review_close` records the `GateDecided` that follows from all this)."""

from __future__ import annotations

import datetime as dt
import difflib
import time
from collections.abc import Callable
from typing import Any

from skillstate.config import SkillConfig
from skillstate.engine import stages
from skillstate.engine.context import RunContext, StoreLog
from skillstate.engine.scoring import evaluate_cached
from skillstate.engine.stops import StopCheck
from skillstate.engine.update import patch_with
from skillstate.errors import ConcurrencyError, ReplayMissError, ReviewPending
from skillstate.log.events import CandidateBuilt, CandidateEvaluated, Event, GateDecided, Scores
from skillstate.log.events_review import (
    APPROVE,
    REJECT,
    TIMEOUT_REVIEWER,
    GateVerdict,
    ReviewDecided,
    ReviewEdit,
    ReviewRequested,
    TypeScore,
)
from skillstate.log.reducer import RunState, StepProgress, cache_key, need, reduce, step_progress
from skillstate.log.review_fold import awaiting
from skillstate.skillopt import review as rules
from skillstate.skillopt.gate import gate_score
from skillstate.skilltree import SKILL_MD, skill_md_path
from skillstate.skilltree.bundle import is_bundle, unbundle
from skillstate.storage.store import StoredEvent
from skillstate.util import canonical_json

AWAIT, REBUILD, EVALUATE, CLOSE = "await_review", "review_rebuild", "review_evaluate", "review_close"
POLL_SECONDS = 1.0  # how often a driver waiting out `review_timeout` looks for a decision


class ReviewWait(Exception):  # noqa: N818  (not an error: the run reached a step a person must decide)
    """Raised by `await_review` out of `drive`, with the state the run waits in."""

    def __init__(self, state: RunState, request: ReviewRequested):
        super().__init__(f"step {request.step} awaits review")
        self.state, self.request = state, request


# --- which stage ------------------------------------------------------------------------------------------------


def next_stage(p: StepProgress) -> str | None:
    """The review's next stage for the step under way (None: the step has no review)."""
    if p.review is None:
        return None
    decided = p.review_decision
    if decided is None:
        return AWAIT
    if rules.kept_candidate(p.review.verdict, decided) and decided.dropped:
        if not p.review_rebuilt:
            return REBUILD
        if p.evaluation is None:
            return EVALUATE
    return CLOSE


# --- the request ----------------------------------------------------------------------------------------------


def gate(ctx: RunContext, state: RunState) -> list[Event]:
    """The gate, and then, when the step falls under `review`, its request instead of its decision."""
    events = stages.decide(ctx, state)
    mode = ctx.config.review
    decided = events[-1] if events else None
    p = step_progress(state)
    changed = p.candidate is not None and p.candidate.changed and p.evaluation is not None
    if mode == "off" or not isinstance(decided, GateDecided) or not rules.under_review(mode, decided.decision,
                                                                                        changed):
        return events
    return [request(ctx, state, decided, mode)]


def request(ctx: RunContext, state: RunState, decided: GateDecided, mode: str) -> ReviewRequested:
    p = step_progress(state)
    cfg = ctx.config
    candidate, evaluation = need(p.candidate, "CandidateBuilt"), need(p.evaluation, "CandidateEvaluated")
    base_text, cand_text = ctx.skill(p.base_skill), ctx.skill(candidate.skill)
    md_name = SKILL_MD if state.skill_tree else "skill"
    diff = ctx.put_blob(canonical_json(file_diffs(base_text, cand_text, md_name)))
    current = state.score_cache.get(cache_key(evaluation.split, need(state.current_skill, "the current skill")))
    edits = review_edits(cfg, state) if cfg.update_mode == "patch" else []
    droppable = bool(edits) and patch_with(cfg, base_text, [e.edit for e in edits])[0] == cand_text
    return ReviewRequested(step=p.step, review=mode, base_skill=p.base_skill, candidate=candidate.skill, diff=diff,
                           verdict=GateVerdict(**decided.model_dump(exclude={"step"})), split=evaluation.split,
                           scores=evaluation.scores, partial=evaluation.partial, current_scores=current,
                           types=type_scores(evaluation.scores, current, cfg), edits=edits, droppable=droppable)


def review_edits(cfg: SkillConfig, state: RunState) -> list[ReviewEdit]:
    """The edits the step's candidate applies, in order: the selected ones the repair kept (some without a
    clause), then the blocker search's removal of a line, if it found one; or, when that search put back an
    edit the screen left out (`blocker_screened`), that edit alone and then the removal. Each with how it
    applied."""
    p = step_progress(state)
    if p.selected is None or p.candidate is None:
        return []
    blocker, report = p.blocker, p.candidate.report
    found = blocker.ablations[blocker.found].edit if blocker is not None and blocker.found is not None else None
    rows: list[tuple[int | None, Any, str]]
    if found is not None and blocker is not None and blocker.screened_edit is not None:
        rows = [(None, blocker.screened_edit, "screened")]
    else:
        repair = p.repair
        gone = set(repair.dropped) if repair is not None else set()
        trimmed = ({a.index: a.kept_as for a in repair.ablations
                    if a.harmful and a.kept_as is not None and a.index in repair.trimmed} if repair is not None
                   else {})
        rows = [(i, trimmed.get(i, e), "trimmed" if i in trimmed else "selected")
                for i, e in enumerate(p.selected.edits) if i not in gone]
    if found is not None:  # blocker_search: the line it removed is one more edit
        rows.append((None, found, "blocker"))
    return [ReviewEdit(edit=e, origin=origin, index=i, status=report[k].status if k < len(report) else None)
            for k, (i, e, origin) in enumerate(rows)]


def type_scores(candidate: Scores, current: Scores | None, cfg: SkillConfig) -> list[TypeScore]:
    """The candidate and the current skill per task type, by the gate metric."""
    def score(scores: Scores | None, task_type: str) -> float | None:
        s = scores.by_task_type.get(task_type) if scores is not None else None
        return None if s is None else round(gate_score(s.hard, s.soft, cfg.gate_metric, cfg.gate_mixed_weight), 6)

    types = sorted(set(candidate.by_task_type) | set(current.by_task_type if current is not None else {}))
    return [TypeScore(task_type=t, candidate=score(candidate, t), current=score(current, t),
                      n=candidate.by_task_type[t].n if t in candidate.by_task_type else 0) for t in types]


def files_of(text: str, md_name: str) -> dict[str, str]:
    """path -> text of a skill as the engine holds it: a bundle's text files (SKILL.md first), or one file."""
    if not is_bundle(text):
        return {md_name: text}
    tree = unbundle(text)
    md = skill_md_path(tree)
    return {path: tree[path].text for path in [md, *(p for p in tree if p != md)] if not tree[path].is_binary}


def file_diffs(base: str, candidate: str, md_name: str = "skill") -> list[dict[str, str]]:
    """One unified diff per file the candidate changes (a file added or removed too), SKILL.md first."""
    a, b = files_of(base, md_name), files_of(candidate, md_name)
    out = []
    for path in [*a, *(p for p in b if p not in a)]:
        before, after = a.get(path), b.get(path)
        if before == after:
            continue
        lines = difflib.unified_diff((before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True),
                                     fromfile=f"current/{path}" if before is not None else "/dev/null",
                                     tofile=f"candidate/{path}" if after is not None else "/dev/null")
        out.append({"path": path, "diff": "".join(line if line.endswith("\n") else line + "\n" for line in lines)})
    return out


# --- after the decision -----------------------------------------------------------------------------------------


def rebuild(cfg: Any, base_text: str, request: ReviewRequested, dropped: list[int]):
    """The candidate without the `dropped` edits: the base patched with the edits kept, in their order, as
    the update stage patches (text, apply report, whether a block had to be restored)."""
    return patch_with(cfg, base_text, rules.kept([e.edit for e in request.edits], dropped))


def await_review(ctx: RunContext, state: RunState) -> list[Event]:
    found = need(awaiting(state), "the review awaited")
    if not isinstance(ctx.log, StoreLog):  # verification takes the recorded decision before this stage
        raise ReplayMissError(f"the log holds no decision on the review of step {found.step}")
    raise ReviewWait(state, found)


def rebuild_candidate(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    req, decided = need(p.review, "ReviewRequested"), need(p.review_decision, "ReviewDecided")
    text, report, restored = rebuild(ctx.config, ctx.skill(p.base_skill), req, decided.dropped)
    skill = ctx.put_skill(text)
    return [CandidateBuilt(step=p.step, base_skill=p.base_skill, skill=skill, changed=skill != p.base_skill,
                           block_restored=restored, report=report, method="patch")]


def evaluate_rebuilt(ctx: RunContext, state: RunState) -> list[Event]:
    """The rebuilt candidate on the split the gate scored, in full (it is kept: no early reject)."""
    p = step_progress(state)
    split, skill = need(p.review, "ReviewRequested").split, need(p.candidate, "CandidateBuilt").skill
    scores, blob, usage = evaluate_cached(ctx, state, skill, split)
    return [CandidateEvaluated(step=p.step, split=split, skill=skill, scores=scores, cached=blob is None,
                               results=blob, usage_by_role=usage)]


def close(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    req, decided = need(p.review, "ReviewRequested"), need(p.review_decision, "ReviewDecided")
    rebuilt = (need(p.evaluation, "the rebuilt candidate's evaluation").scores.gate
               if decided.dropped and rules.kept_candidate(req.verdict, decided) else None)
    return [GateDecided(step=p.step, **rules.closing(req.verdict, decided, rebuilt))]


STAGES = {AWAIT: await_review, REBUILD: rebuild_candidate, EVALUATE: evaluate_rebuilt, CLOSE: close}


# --- driving around the wait ----------------------------------------------------------------------------------

Drive = Callable[..., RunState]


def pending(ctx: RunContext, request: ReviewRequested) -> ReviewPending:
    v = request.verdict
    return ReviewPending(f"step {request.step} of run {ctx.run_id} awaits review (review: {request.review}; the "
                         f"gate's verdict: {v.decision}, {v.reason})", ctx.run_id, request.step)


def drive_reviewed(ctx: RunContext, state: RunState, drive: Drive, stops: StopCheck | None = None) -> RunState:
    """`drive` the run; at a step that awaits review, stop (`ReviewPending`), or with `review_timeout` wait
    for a decision in the log (a reviewer's, or the timeout's) and go on from it."""
    while True:
        try:
            return drive(ctx, state, stops=stops)
        except ReviewWait as wait:
            state, request = wait.state, wait.request
        if ctx.config.review_timeout is None or not isinstance(ctx.log, StoreLog):
            raise pending(ctx, request)
        stored = wait_for_decision(ctx, ctx.log, state, request)
        state = reduce(state, stored.event)
        ctx.report("event", AWAIT, state, stored.event, stored)


def requested_at(log: StoreLog, request: ReviewRequested) -> dt.datetime:
    """When `request` was appended (the store's clock)."""
    for s in reversed(log.store.read_events(log.run_id)):
        if s.type == ReviewRequested.type and s.step == request.step and s.created_at is not None:
            return s.created_at if s.created_at.tzinfo else s.created_at.replace(tzinfo=dt.timezone.utc)
    raise ReplayMissError(f"run {log.run_id} holds no ReviewRequested for step {request.step}")


def timeout_decision(cfg: SkillConfig, request: ReviewRequested, now: dt.datetime) -> ReviewDecided:
    decision = APPROVE if cfg.review_default == "accept" else REJECT
    return ReviewDecided(step=request.step, candidate=request.candidate, decision=decision, reviewer=TIMEOUT_REVIEWER,
                         at=now.isoformat(timespec="seconds"),
                         comment=f"no decision within review_timeout={cfg.review_timeout:g} s; "
                                 f"review_default={cfg.review_default}")


def wait_for_decision(ctx: RunContext, log: StoreLog, state: RunState, request: ReviewRequested,
                      clock: Callable[[], dt.datetime] | None = None,
                      sleep: Callable[[float], None] = time.sleep) -> StoredEvent:
    """The decision on `request` once it is in the log: a reviewer's, appended by another process while this
    driver waits (its log position follows), or, at `review_timeout` after the request, `review_default`
    appended here under the same append check (a reviewer who got in first wins; this then reads theirs)."""
    from skillstate.engine.review_desk import decision_after

    cfg = ctx.config
    now = clock or (lambda: dt.datetime.now(dt.timezone.utc))
    deadline = requested_at(log, request) + dt.timedelta(seconds=need(cfg.review_timeout, "review_timeout"))
    ctx.report("notice", f"    review     step {request.step} awaits a decision until "
                         f"{deadline.isoformat(timespec='seconds')} (review_timeout {cfg.review_timeout:g} s, then "
                         f"review_default {cfg.review_default})", state)
    while True:
        found = decision_after(log.store, log.run_id, log.last_seq, log.last_hash, request)
        if found is None and now() >= deadline:
            if log.lease is not None:
                log.lease.check()
            try:
                found = log.store.append(log.run_id, [timeout_decision(cfg, request, now())], last_seq=log.last_seq,
                                         last_hash=log.last_hash)[0]
            except ConcurrencyError:
                continue  # a reviewer decided first: read theirs
        if found is not None:
            log.last_seq, log.last_hash = found.seq, found.hash
            return found
        sleep(max(0.01, min(POLL_SECONDS, (deadline - now()).total_seconds())))
