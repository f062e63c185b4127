"""Reflect and Aggregate: the analysts' patches (edits, revision suggestions
or whole skills, by `update_mode`) and their hierarchical merge."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from skillstate.engine.context import RunContext, item_view
from skillstate.engine.parsing import (
    AnalystReply,
    FileAnalystReply,
    FileMergeReply,
    MergeReply,
    SkillReply,
    SuggestionReply,
    parse_reply,
)
from skillstate.engine.prompting import compose, edits_json, to_json
from skillstate.log.events import Edit, Event, ItemResult, MergeCall, PatchesMerged, PatchProposed
from skillstate.log.reducer import RunState, need, step_progress
from skillstate.skilltree.bundle import is_bundle
from skillstate.util import chunked, seeded_rng

Minibatch = tuple[int, str, int, list[str]]  # (sub-batch, source, index, item ids)

ANALYST_PROMPTS = {"patch": "{}_analyst", "rewrite": "{}_suggestions", "full_rewrite": "{}_rewrite"}
ANALYST_REPLIES: dict[str, type[AnalystReply] | type[SuggestionReply] | type[SkillReply]] = {
    "patch": AnalystReply, "rewrite": SuggestionReply, "full_rewrite": SkillReply,
}

T = TypeVar("T")


def plan_minibatches(results: list[ItemResult], seed: int, step: int, size: int, failure_only: bool,
                     sub_batch: int = 0) -> list[tuple[str, int, list[str]]]:
    """(source, index, item ids) of every analyst call of one (sub-)batch."""
    groups = [("failure", [r.item_id for r in results if r.hard < 1])]
    if not failure_only:
        groups.append(("success", [r.item_id for r in results if r.hard >= 1]))
    plan: list[tuple[str, int, list[str]]] = []
    for source, ids in groups:
        extra = (sub_batch,) if sub_batch else ()
        seeded_rng("reflect", seed, step, source, *extra).shuffle(ids)
        plan.extend((source, i, chunk) for i, chunk in enumerate(chunked(ids, size)))
    return plan


def step_plan(ctx: RunContext, state: RunState) -> list[Minibatch]:
    """Every analyst call of the step: with accumulation, each sub-batch is
    cut into its own minibatches and never mixed with another."""
    p = step_progress(state)
    cfg = ctx.config
    subs = p.sub_batches or (p.batch_item_ids,)
    by_id = {r.item_id: r for r in need(p.rollout, "RolloutCompleted").results}
    plan: list[Minibatch] = []
    for j, ids in enumerate(subs):
        results = [by_id[i] for i in ids]
        plan.extend((j, *mb) for mb in plan_minibatches(results, cfg.seed, p.step, cfg.minibatch_size,
                                                        cfg.failure_only, sub_batch=j))
    return plan


def pending_minibatches(ctx: RunContext, state: RunState) -> list[Minibatch]:
    done = {(patch.sub_batch, patch.source, patch.minibatch) for patch in step_progress(state).patches}
    return [mb for mb in step_plan(ctx, state) if mb[:3] not in done]


def reflect(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    mode = ctx.config.update_mode
    by_id = {r.item_id: r for r in need(p.rollout, "RolloutCompleted").results}
    skill = ctx.skill(p.base_skill)

    def analyse(mb: Minibatch) -> PatchProposed:
        sub, source, index, ids = mb
        views = [item_view(ctx.env, by_id[i], json.loads(ctx.blob(need(by_id[i].trajectory, "a trajectory"))))
                 for i in ids]
        prompt = compose(ctx, state, ANALYST_PROMPTS[mode].format(source), memo=True, buffer=True, skill=skill,
                         budget=p.edit_budget, trajectories=to_json(views))
        model = FileAnalystReply if mode == "patch" and is_bundle(skill) else ANALYST_REPLIES[mode]
        result = ctx.optimizer(prompt, reply=model)
        common: dict[str, Any] = dict(step=p.step, source=source, minibatch=index, item_ids=ids, call=result.ref,
                                      sub_batch=sub)
        if not result.ok:
            return PatchProposed(status="error", reasoning=result.error or "", **common)
        reply = parse_reply(result.text, model)
        if reply is None:
            return PatchProposed(status="unparseable", reply=ctx.put_blob(result.text), **common)
        extra: dict[str, Any] = {}
        if isinstance(reply, AnalystReply):  # update_mode patch
            extra["edits"] = [Edit(op=e.op, target=e.target, content=e.content, source=source, support=len(ids),
                                   file=getattr(e, "file", "")) for e in reply.edits]
        elif isinstance(reply, SuggestionReply):  # update_mode rewrite
            extra["edits"] = [Edit(op="suggest", content=s, source=source, support=len(ids))
                              for s in reply.suggestions if s.strip()]
        else:  # update_mode full_rewrite
            extra["skill"] = ctx.put_blob(reply.skill)
        return PatchProposed(status="ok", reasoning=reply.reasoning, failure_summary=reply.failure_summary,
                             **extra, **common)

    minibatches = pending_minibatches(ctx, state)
    ctx.expect_calls(len(minibatches))  # one optimizer call each
    return ctx.map(analyse, minibatches)


# --- aggregate -----------------------------------------------------------


def merge_reply(skill: str) -> type[MergeReply]:
    """The merges' reply: its edits may name a file where the run trains a skill directory."""
    return FileMergeReply if is_bundle(skill) else MergeReply


def _adopt(reply_edits, inputs: list[Edit], source: str) -> list[Edit]:
    """Merged edits with provenance: support of identical inputs, else the largest."""
    support: dict[tuple[str, str, str, str], int] = defaultdict(int)
    sources: dict[tuple[str, str, str, str], str] = {}
    for e in inputs:
        support[(e.op, e.target, e.content, e.file)] += e.support
        sources.setdefault((e.op, e.target, e.content, e.file), e.source)
    top = max((e.support for e in inputs), default=0)
    out = []
    for e in reply_edits:
        key = (e.op, e.target, e.content, getattr(e, "file", ""))
        out.append(Edit(op=e.op, target=e.target, content=e.content, source=sources.get(key, source),
                        support=support.get(key, top), file=key[3]))
    return out


Merge = Callable[[int, list[T]], tuple[T, MergeCall]]


def merge_levels(ctx: RunContext, trees: list[tuple[list[T], Merge[T]]]) -> list[tuple[T | None, list[MergeCall]]]:
    """Merge each tree's items level by level in groups of merge_batch_size
    (a group of one passes through); `merge_group(level, group)` returns
    (merged, call). The trees are independent, so each level's groups of
    every tree go out together; each tree's calls and levels are those it
    would have alone."""
    current = [list(items) for items, _ in trees]
    calls: list[list[MergeCall]] = [[] for _ in trees]
    level = 0
    while any(len(c) > 1 for c in current):
        level += 1
        jobs = [(t, g) for t, c in enumerate(current) if len(c) > 1 for g in chunked(c, ctx.config.merge_batch_size)]

        def merge_or_pass(job: tuple[int, list[T]], lv: int = level) -> tuple[T, MergeCall | None]:
            t, g = job
            return (g[0], None) if len(g) == 1 else trees[t][1](lv, g)

        outcomes = ctx.map(merge_or_pass, jobs)
        merged: list[list[T]] = [[] for _ in trees]
        for (t, _), (item, call) in zip(jobs, outcomes, strict=True):
            merged[t].append(item)
            if call is not None:
                calls[t].append(call)
        current = [merged[t] if len(c) > 1 else c for t, c in enumerate(current)]
    return [(c[0] if c else None, calls[t]) for t, c in enumerate(current)]


def edit_merger(ctx: RunContext, state: RunState, side: str, skill: str) -> Merge[list[Edit]]:
    """Merge edit patches; a failed merge call concatenates the group's edits."""

    def merge_group(level: int, group: list[list[Edit]]) -> tuple[list[Edit], MergeCall]:
        payload = [{"patch": i, "edits": edits_json(g)} for i, g in enumerate(group)]
        result = ctx.optimizer(compose(ctx, state, "merge", memo=True, skill=skill, patches=to_json(payload)),
                               reply=merge_reply(skill))
        flat = [e for g in group for e in g]
        reply = parse_reply(result.text, merge_reply(skill)) if result.ok else None
        status = "fallback" if reply is None else "ok"
        merged = flat if reply is None else _adopt(reply.edits, flat, side)
        return merged, MergeCall(level=level, side=side, inputs=len(group), status=status, call=result.ref)

    return merge_group


def skill_merger(ctx: RunContext, state: RunState, side: str, skill: str) -> Merge[str]:
    """full_rewrite: merge whole skills; a failed merge call keeps the group's first."""

    def merge_group(level: int, group: list[str]) -> tuple[str, MergeCall]:
        return _merge_skills(ctx, state, skill, [(side, text) for text in group], level, side)

    return merge_group


def _merge_skills(ctx: RunContext, state: RunState, skill: str, versions: list[tuple[str, str]], level: int,
                  side: str) -> tuple[str, MergeCall]:
    payload = [{"version": i, "source": source, "skill": text} for i, (source, text) in enumerate(versions)]
    result = ctx.optimizer(compose(ctx, state, "merge_skills", memo=True, skill=skill, skills=to_json(payload)),
                           reply=SkillReply)
    reply = parse_reply(result.text, SkillReply) if result.ok else None
    if reply is None or not reply.skill.strip():
        status, merged = "fallback", versions[0][1]
    else:
        status, merged = "ok", reply.skill
    return merged, MergeCall(level=level, side=side, inputs=len(versions), status=status, call=result.ref)


def aggregate(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    skill = ctx.skill(p.base_skill)
    if ctx.config.update_mode == "full_rewrite":
        return [_aggregate_skills(ctx, state, skill)]
    (fail, fail_calls), (succ, succ_calls) = merge_levels(ctx, [
        ([x.edits for x in p.patches if x.source == side and x.edits], edit_merger(ctx, state, side, skill))
        for side in ("failure", "success")])
    fail_edits, succ_edits = fail or [], succ or []
    calls = fail_calls + succ_calls
    if fail_edits and succ_edits:
        result = ctx.optimizer(compose(
            ctx, state, "merge_final", memo=True, skill=skill,
            failure_patch=to_json({"edits": edits_json(fail_edits)}),
            success_patch=to_json({"edits": edits_json(succ_edits)})), reply=merge_reply(skill))
        reply = parse_reply(result.text, merge_reply(skill)) if result.ok else None
        if reply is None:
            edits = fail_edits + succ_edits
            calls.append(MergeCall(level=0, side="final", inputs=2, status="fallback", call=result.ref))
        else:
            edits = _adopt(reply.edits, fail_edits + succ_edits, "failure")
            calls.append(MergeCall(level=0, side="final", inputs=2, status="ok", call=result.ref))
    else:
        edits = fail_edits or succ_edits
    return [PatchesMerged(step=p.step, failure_edits=fail_edits, success_edits=succ_edits, edits=edits,
                          merges=calls)]


def _aggregate_skills(ctx: RunContext, state: RunState, skill: str) -> PatchesMerged:
    p = step_progress(state)
    sides: dict[str, str | None] = {}
    calls: list[MergeCall] = []
    trees = merge_levels(ctx, [([ctx.blob(x.skill) for x in p.patches if x.source == side and x.skill],
                                skill_merger(ctx, state, side, skill)) for side in ("failure", "success")])
    for side, (merged_side, side_calls) in zip(("failure", "success"), trees, strict=True):
        sides[side] = merged_side
        calls.extend(side_calls)
    merged = sides["failure"] or sides["success"]
    if sides["failure"] and sides["success"]:
        merged, call = _merge_skills(ctx, state, skill, [("failure", sides["failure"]),
                                                         ("success", sides["success"])], 0, "final")
        calls.append(call)
    return PatchesMerged(step=p.step, failure_edits=[], success_edits=[], edits=[], merges=calls,
                         skill=ctx.put_blob(merged) if merged is not None else None)
