"""The stages of SkillOpt. Each takes the run context and the folded state
and returns the events it produces; none of them writes anything itself."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from skillstate import gate as gate_rules
from skillstate.editor import apply_edits
from skillstate.engine.context import RunContext, item_view
from skillstate.engine.parsing import AnalystReply, MergeReply, RankReply, parse_reply
from skillstate.events import (
    BaselineEvaluated, CandidateBuilt, CandidateEvaluated, Edit, EditsSelected, Event, GateDecided, ItemResult,
    MergeCall, PatchesMerged, PatchProposed, RolloutCompleted, RunCompleted, Scores, SplitScore, StepStarted,
    TestEvaluated, Usage, usage_of,
)
from skillstate.prompts import render
from skillstate.reducer import RunState, cache_key
from skillstate.scheduler import edit_budget, epoch_batches, position
from skillstate.util import canonical_json, chunked, seeded_rng

# --- rollouts and evaluation --------------------------------------------


def rollout_items(ctx: RunContext, skill: str, items: list[dict[str, Any]]) -> list[ItemResult]:
    def one(item: dict[str, Any]) -> ItemResult:
        out = ctx.env.rollout(skill, item, lambda msgs: ctx.llm("target", msgs), ctx.prompts)
        return ItemResult(
            item_id=item["id"], task_type=out.task_type, hard=out.hard, soft=out.soft, fail_reason=out.fail_reason,
            prediction=out.prediction, trajectory=ctx.put_blob(canonical_json(out.messages)),
            call=out.call.ref if out.call else None,
        )

    return ctx.map(one, items)


def summarize(results: list[ItemResult], metric: str, weight: float) -> Scores:
    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    groups: dict[str, list[ItemResult]] = defaultdict(list)
    for r in results:
        groups[r.task_type or "untyped"].append(r)
    hard, soft = mean([r.hard for r in results]), mean([r.soft for r in results])
    return Scores(
        hard=hard, soft=soft, gate=gate_rules.gate_score(hard, soft, metric, weight), n=len(results),
        by_task_type={t: SplitScore(hard=mean([r.hard for r in rs]), soft=mean([r.soft for r in rs]), n=len(rs))
                      for t, rs in sorted(groups.items())},
    )


def evaluate(ctx: RunContext, skill_hash: str, split: str) -> tuple[Scores, str, dict[str, Usage]]:
    results = rollout_items(ctx, ctx.blob(skill_hash), ctx.env.items(split))
    scores = summarize(results, ctx.config.gate_metric, ctx.config.gate_mixed_weight)
    blob = ctx.put_blob(canonical_json([r.model_dump(mode="json") for r in results]))
    return scores, blob, usage_of([r.call for r in results])


def baseline(ctx: RunContext, state: RunState) -> list[Event]:
    split = ctx.config.val_split
    scores, blob, usage = evaluate(ctx, state.initial_skill, split)
    return [BaselineEvaluated(split=split, skill=state.initial_skill, scores=scores, results=blob, usage_by_role=usage)]


def start_step(ctx: RunContext, state: RunState) -> list[Event]:
    cfg = ctx.config
    step = state.last_completed_step + 1
    epoch, index = position(step, state.steps_per_epoch)
    train_ids = [item["id"] for item in ctx.env.items(cfg.train_split)]
    batch = epoch_batches(train_ids, cfg.seed, epoch, cfg.batch_size)[index - 1]
    budget = edit_budget(step, state.total_steps, cfg.edit_budget, cfg.min_edit_budget, cfg.lr_scheduler)
    return [StepStarted(step=step, epoch=epoch, batch_item_ids=batch, edit_budget=budget)]


def rollout(ctx: RunContext, state: RunState) -> list[Event]:
    p = state.progress
    results = rollout_items(ctx, ctx.blob(p.base_skill), [ctx.env.item(i) for i in p.batch_item_ids])
    return [RolloutCompleted(step=p.step, skill=p.base_skill, results=results)]


# --- reflect -------------------------------------------------------------


def plan_minibatches(results: list[ItemResult], seed: int, step: int, size: int,
                     failure_only: bool) -> list[tuple[str, int, list[str]]]:
    """(source, index, item ids) of every analyst call of a step."""
    groups = [("failure", [r.item_id for r in results if r.hard < 1])]
    if not failure_only:
        groups.append(("success", [r.item_id for r in results if r.hard >= 1]))
    plan = []
    for source, ids in groups:
        seeded_rng("reflect", seed, step, source).shuffle(ids)
        plan.extend((source, i, chunk) for i, chunk in enumerate(chunked(ids, size)))
    return plan


def pending_minibatches(ctx: RunContext, state: RunState) -> list[tuple[str, int, list[str]]]:
    p = state.progress
    done = {(patch.source, patch.minibatch) for patch in p.patches}
    plan = plan_minibatches(p.rollout.results, ctx.config.seed, p.step, ctx.config.minibatch_size,
                            ctx.config.failure_only)
    return [mb for mb in plan if (mb[0], mb[1]) not in done]


def reflect(ctx: RunContext, state: RunState) -> list[Event]:
    p = state.progress
    by_id = {r.item_id: r for r in p.rollout.results}
    skill = ctx.blob(p.base_skill)

    def analyse(mb: tuple[str, int, list[str]]) -> PatchProposed:
        source, index, ids = mb
        views = [item_view(ctx.env, by_id[i], json.loads(ctx.blob(by_id[i].trajectory))) for i in ids]
        prompt = render(ctx.prompts[f"{source}_analyst"], skill=skill, budget=p.edit_budget,
                        trajectories=json.dumps(views, indent=1, ensure_ascii=False))
        result = ctx.optimizer(prompt)
        common = dict(step=p.step, source=source, minibatch=index, item_ids=ids, call=result.ref)
        if not result.ok:
            return PatchProposed(status="error", reasoning=result.error or "", **common)
        reply = parse_reply(result.text, AnalystReply)
        if reply is None:
            return PatchProposed(status="unparseable", reply=ctx.put_blob(result.text), **common)
        edits = [Edit(op=e.op, target=e.target, content=e.content, source=source, support=len(ids))
                 for e in reply.edits]
        return PatchProposed(status="ok", reasoning=reply.reasoning, failure_summary=reply.failure_summary,
                             edits=edits, **common)

    return ctx.map(analyse, pending_minibatches(ctx, state))


# --- aggregate -----------------------------------------------------------


def _edits_json(edits: list[Edit], with_index: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, e in enumerate(edits):
        row = {"op": e.op, "target": e.target, "content": e.content, "source": e.source, "support": e.support}
        out.append({"index": i, **row} if with_index else row)
    return out


def _adopt(reply_edits, inputs: list[Edit], source: str) -> list[Edit]:
    """Merged edits with provenance: support of identical inputs, else the largest."""
    support: dict[tuple[str, str, str], int] = defaultdict(int)
    sources: dict[tuple[str, str, str], str] = {}
    for e in inputs:
        support[(e.op, e.target, e.content)] += e.support
        sources.setdefault((e.op, e.target, e.content), e.source)
    top = max((e.support for e in inputs), default=0)
    return [Edit(op=e.op, target=e.target, content=e.content,
                 source=sources.get((e.op, e.target, e.content), source),
                 support=support.get((e.op, e.target, e.content), top)) for e in reply_edits]


def merge_tree(ctx: RunContext, side: str, skill: str, patches: list[list[Edit]]) -> tuple[list[Edit], list[MergeCall]]:
    """Merge patches level by level in groups of merge_batch_size."""
    current = [p for p in patches if p]
    calls: list[MergeCall] = []
    level = 0
    while len(current) > 1:
        level += 1

        def merge_group(group: list[list[Edit]]) -> tuple[list[Edit], MergeCall | None]:
            if len(group) == 1:
                return group[0], None
            payload = [{"patch": i, "edits": _edits_json(g)} for i, g in enumerate(group)]
            result = ctx.optimizer(render(ctx.prompts["merge"], skill=skill,
                                          patches=json.dumps(payload, indent=1, ensure_ascii=False)))
            flat = [e for g in group for e in g]
            reply = parse_reply(result.text, MergeReply) if result.ok else None
            if reply is None:
                return flat, MergeCall(level=level, side=side, inputs=len(group), status="fallback", call=result.ref)
            return _adopt(reply.edits, flat, side), MergeCall(level=level, side=side, inputs=len(group),
                                                             status="ok", call=result.ref)

        outcomes = ctx.map(merge_group, chunked(current, ctx.config.merge_batch_size))
        current = [edits for edits, _ in outcomes]
        calls.extend(call for _, call in outcomes if call is not None)
    return (current[0] if current else []), calls


def aggregate(ctx: RunContext, state: RunState) -> list[Event]:
    p = state.progress
    skill = ctx.blob(p.base_skill)
    fail_edits, fail_calls = merge_tree(ctx, "failure", skill, [x.edits for x in p.patches if x.source == "failure"])
    succ_edits, succ_calls = merge_tree(ctx, "success", skill, [x.edits for x in p.patches if x.source == "success"])
    calls = fail_calls + succ_calls
    if fail_edits and succ_edits:
        result = ctx.optimizer(render(
            ctx.prompts["merge_final"], skill=skill,
            failure_patch=json.dumps({"edits": _edits_json(fail_edits)}, indent=1, ensure_ascii=False),
            success_patch=json.dumps({"edits": _edits_json(succ_edits)}, indent=1, ensure_ascii=False)))
        reply = parse_reply(result.text, MergeReply) if result.ok else None
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


# --- select, update ----------------------------------------------------------


def fallback_order(edits: list[Edit]) -> list[int]:
    """Failure edits first, then by support, then by position."""
    return sorted(range(len(edits)), key=lambda i: (edits[i].source != "failure", -edits[i].support, i))


def select(ctx: RunContext, state: RunState) -> list[Event]:
    p = state.progress
    edits, budget = p.merged.edits, p.edit_budget
    if len(edits) <= budget:
        return [EditsSelected(step=p.step, budget=budget, candidates=len(edits), method="all",
                              selected_indices=list(range(len(edits))), edits=edits)]
    result = ctx.optimizer(render(ctx.prompts["rank"], skill=ctx.blob(p.base_skill), budget=budget,
                                  edits=json.dumps(_edits_json(edits, with_index=True), indent=1, ensure_ascii=False)))
    reply = parse_reply(result.text, RankReply) if result.ok else None
    indices: list[int] = []
    if reply is not None:
        for i in reply.selected_indices:
            if 0 <= i < len(edits) and i not in indices:
                indices.append(i)
        indices = indices[:budget]
    method = "ranked"
    if not indices:
        indices, method = fallback_order(edits)[:budget], "fallback"
    return [EditsSelected(step=p.step, budget=budget, candidates=len(edits), method=method, selected_indices=indices,
                          edits=[edits[i] for i in indices], call=result.ref)]


def update(ctx: RunContext, state: RunState) -> list[Event]:
    p = state.progress
    text, report = apply_edits(ctx.blob(p.base_skill), p.selected.edits)
    skill = ctx.put_blob(text)
    return [CandidateBuilt(step=p.step, base_skill=p.base_skill, skill=skill, report=report,
                           changed=skill != p.base_skill)]


# --- gate ------------------------------------------------------------------


def evaluate_candidate(ctx: RunContext, state: RunState) -> list[Event]:
    p = state.progress
    split, skill = ctx.config.val_split, p.candidate.skill
    cached = state.score_cache.get(cache_key(split, skill))
    if cached is not None:
        gate = gate_rules.gate_score(cached.hard, cached.soft, ctx.config.gate_metric, ctx.config.gate_mixed_weight)
        return [CandidateEvaluated(step=p.step, split=split, skill=skill, scores=cached.model_copy(update={"gate": gate}),
                                   cached=True)]
    scores, blob, usage = evaluate(ctx, skill, split)
    return [CandidateEvaluated(step=p.step, split=split, skill=skill, scores=scores, cached=False, results=blob,
                               usage_by_role=usage)]


def decide(ctx: RunContext, state: RunState) -> list[Event]:
    p = state.progress
    current, best = state.current_score, state.best_score
    if p.merged is not None and not p.merged.edits:
        return [GateDecided(step=p.step, decision=gate_rules.SKIP, candidate_score=None, current_score=current,
                            best_score=best, reason="no edits survived aggregation")]
    score = p.evaluation.scores.gate
    decision = gate_rules.decide(score, current, best)
    reason = {
        gate_rules.ACCEPT_BEST: f"{score:.4f} > best {best:.4f}",
        gate_rules.ACCEPT: f"{score:.4f} > current {current:.4f} (best {best:.4f})",
        gate_rules.REJECT: f"{score:.4f} <= current {current:.4f}",
    }[decision]
    if not p.candidate.changed:
        reason += "; candidate identical to the current skill"
    return [GateDecided(step=p.step, decision=decision, candidate_score=score, current_score=current,
                        best_score=best, reason=reason)]


# --- end of run --------------------------------------------------------------


def test_eval(label: str):
    def stage(ctx: RunContext, state: RunState) -> list[Event]:
        skill = state.initial_skill if label == "baseline" else state.best_skill
        split = ctx.config.test_split
        scores, blob, usage = evaluate(ctx, skill, split)
        return [TestEvaluated(label=label, split=split, skill=skill, scores=scores, results=blob, usage_by_role=usage)]

    return stage


def complete(ctx: RunContext, state: RunState) -> list[Event]:
    return [RunCompleted(steps=state.last_completed_step, best_step=state.best_step, best_score=state.best_score,
                         current_score=state.current_score, best_skill=state.best_skill)]
