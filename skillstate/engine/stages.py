"""The stages of SkillOpt. Each takes the run context and the folded state
and returns the events it produces; none of them writes anything itself."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from skillstate.bank.document import prompt_for
from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.llm.base import CircuitOpen
from skillstate.log.events import (
    BaselineEvaluated,
    CandidateEvaluated,
    Event,
    GateDecided,
    ItemResult,
    PartialEval,
    RetrievedSkill,
    RolloutCompleted,
    RunCompleted,
    Scores,
    SplitScore,
    StepStarted,
    TestEvaluated,
    Usage,
    usage_of,
)
from skillstate.log.events_pareto import FrontMember, ParentChosen
from skillstate.log.reducer import RunState, cache_key, need, step_progress
from skillstate.skillopt import gate as gate_rules
from skillstate.skillopt import pareto
from skillstate.skillopt import repair as repair_rules
from skillstate.skillopt.repair import gate_note as repair_note
from skillstate.skillopt.scheduler import edit_budget, epoch_batches, position
from skillstate.util import canonical_json

# --- rollouts and evaluation --------------------------------------------


def rollout_one(ctx: RunContext, skill: str, item: dict[str, Any], sample: int | None = None) -> ItemResult:
    """One item rolled out with `skill` (as sample `sample` of several: its
    requests carry that index as their seed), where the run's executor runs
    rollouts. An environment that raises stops the run (EnvFailure); an LLM
    stop raised inside the rollout passes through."""
    retrieved: list[RetrievedSkill] = []
    if ctx.config.mode == "bank":  # the skill is the bank: this task sees the skills retrieved for it
        skill, retrieved = prompt_for(skill, item, ctx.config.bank, ctx.embedder)
    out = ctx.executor.rollout(ctx, skill, item, sample)
    stored = out.trajectory if out.trajectory is not None else out.messages
    return ItemResult(
        item_id=item["id"], task_type=out.task_type, hard=out.hard, soft=out.soft, fail_reason=out.fail_reason,
        prediction=out.prediction, trajectory=ctx.put_blob(canonical_json(stored)),
        call=out.call.ref if out.call else None, calls=[c.ref for c in out.calls], turns=out.turns,
        seed=out.seed, retrieved=retrieved, sample=sample,
    )


def rollout_items(ctx: RunContext, skill: str, items: list[dict[str, Any]]) -> list[ItemResult]:
    """Every item rolled out with `skill`, in input order. Episodes end at
    their first failed target call, so besides the calls' circuit breaker,
    too large a share of rollouts ended by failed calls stops the stage too
    (CircuitOpen), before anything is appended."""
    ctx.expect_calls(ctx.rollout_calls(len(items)))
    results = ctx.map(lambda item: rollout_one(ctx, skill, item), items)
    check_rollout_errors(ctx, results)
    return results


def check_rollout_errors(ctx: RunContext, results: list[ItemResult]) -> None:
    """The calls' share rule first (its message names the commonest error),
    then the same share over rollouts: an episode stops at its first failed
    call, so its failed calls alone understate how many episodes they ended."""
    ctx.health.end_stage()
    failed = [r for r in results if r.fail_reason.startswith("rollout_error")]
    share = ctx.health.max_share
    if len(results) >= 4 and share < 1.0 and len(failed) > share * len(results):
        raise CircuitOpen(f"{len(failed)} of the {len(results)} rollouts of stage {ctx.health.stage} ended on a "
                          f"failed target call (more than max_stage_failure_share={share:g}; the last: "
                          f"{failed[-1].fail_reason.removeprefix('rollout_error: ')[:200]})")


def summarize(results: list[ItemResult], metric: str, weight: float, skill: str = "",
              density_weight: float = 0.0, length_penalty: float = 0.0) -> Scores:
    """Scores of a split; the gate value adds the semantic-density bonus and subtracts the length cost."""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    groups: dict[str, list[ItemResult]] = defaultdict(list)
    for r in results:
        groups[r.task_type or "untyped"].append(r)
    hard, soft = mean([r.hard for r in results]), mean([r.soft for r in results])
    density = gate_rules.semantic_density(skill)  # always stored: a fork may turn the bonus on later
    cost = gate_rules.length_cost(skill, length_penalty)
    return Scores(
        hard=hard, soft=soft, n=len(results), density=density, length_cost=cost,
        gate=gate_rules.with_density(gate_rules.gate_score(hard, soft, metric, weight), density, density_weight,
                                     cost),
        by_task_type={t: SplitScore(hard=mean([r.hard for r in rs]), soft=mean([r.soft for r in rs]), n=len(rs))
                      for t, rs in sorted(groups.items())},
    )


def evaluate(ctx: RunContext, skill_hash: str, split: str) -> tuple[Scores, str, dict[str, Usage]]:
    skill = ctx.blob(skill_hash)
    results = rollout_items(ctx, skill, ctx.env.items(split))
    cfg = ctx.config
    scores = summarize(results, cfg.gate_metric, cfg.gate_mixed_weight, skill, cfg.semantic_density_weight,
                       cfg.gate_length_penalty)
    blob = ctx.put_blob(canonical_json([r.model_dump(mode="json") for r in results]))
    return scores, blob, usage_of([c for r in results for c in r.all_calls()])


def baseline(ctx: RunContext, state: RunState) -> list[Event]:
    # the skill the steps start from: the initial one, or (mode bank) the bank seeded from imported trajectories
    split, skill = ctx.config.val_split, need(state.start_skill, "the initial skill")
    scores, blob, usage = evaluate(ctx, skill, split)
    return [BaselineEvaluated(split=split, skill=skill, scores=scores, results=blob, usage_by_role=usage)]


def step_batches(ctx: RunContext, state: RunState, step: int) -> list[list[str]]:
    """The train item ids of `step`, one list per sub-batch (the seeded shuffle of its epoch)."""
    cfg = ctx.config
    epoch, index = position(step, state.steps_per_epoch)
    train_ids = [item["id"] for item in ctx.env.items(cfg.train_split)]
    k = cfg.accumulation
    return epoch_batches(train_ids, cfg.seed, epoch, cfg.batch_size, k)[(index - 1) * k: index * k]


def start_step(ctx: RunContext, state: RunState) -> list[Event]:
    cfg = ctx.config
    step = state.last_completed_step + 1
    epoch, _ = position(step, state.steps_per_epoch)
    k = cfg.accumulation
    batches = step_batches(ctx, state, step)
    budget = edit_budget(step, state.total_steps, cfg.edit_budget, cfg.min_edit_budget, cfg.lr_scheduler)
    started = StepStarted(step=step, epoch=epoch, batch_item_ids=[i for b in batches for i in b],
                          edit_budget=budget, sub_batches=batches if k > 1 else [])
    if cfg.parent_selection == "pareto":
        return [started, *choose_parent(ctx, state, step)]
    return [started]


def parent_pool(state: RunState, split: str) -> list[tuple[str, Scores]]:
    """The skills a parent is drawn from: the one the steps started from and
    every skill current after a step (in that order, each once), those with
    a full score on `split` in the log."""
    skills = [state.start_skill, *(rec.current_skill for rec in state.history), state.current_skill]
    out: dict[str, Scores] = {}
    for skill in skills:
        scores = state.score_cache.get(cache_key(split, skill or ""))
        if skill and scores is not None and skill not in out:
            out[skill] = scores
    return list(out.items())


def choose_parent(ctx: RunContext, state: RunState, step: int) -> list[Event]:
    """parent_selection pareto: the step's parent, drawn from the front of
    the pool (none with fewer than two skills in it: the current one it is)."""
    cfg = ctx.config
    pool = parent_pool(state, cfg.val_split)
    current = need(state.current_skill, "the current skill")
    if len(pool) < 2:
        return []
    by_type = [(skill, {t: gate_rules.gate_score(s.hard, s.soft, cfg.gate_metric, cfg.gate_mixed_weight)
                        for t, s in scores.by_task_type.items()}) for skill, scores in pool]
    members = pareto.front(by_type)
    chosen = pareto.draw(members, cfg.seed, step)
    overall = {skill: gate_rules.gate_of(scores, cfg.gate_metric, cfg.gate_mixed_weight, cfg.semantic_density_weight)
               for skill, scores in pool}
    score = overall[chosen]
    front = [FrontMember(skill=skill, score=overall[skill], types=types) for skill, types in members.items()]
    kept = "kept the current skill" if chosen == current else "switched from the current skill"
    return [ParentChosen(step=step, skill=chosen, score=score, previous_skill=current, front=front, pool=len(pool),
                         reason=f"drew 1 of {len(front)} on the front of {len(pool)} skills ({kept}); it leads "
                                f"{', '.join(members[chosen])}")]


def rollout(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    results = rollout_items(ctx, ctx.blob(p.base_skill), [ctx.env.item(i) for i in p.batch_item_ids])
    return [RolloutCompleted(step=p.step, skill=p.base_skill, results=results)]


# --- gate ------------------------------------------------------------------


def evaluate_candidate(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg = ctx.config
    split, skill = cfg.val_split, need(p.candidate, "CandidateBuilt").skill
    # the repair pairs every item, unless it pairs early reject's prefix (`repair_prefix`) in every mode
    full = cfg.repair_full_evaluation and not cfg.repair_prefix and repair_rules.may_examine(cfg, p)
    if cfg.early_reject and cfg.use_gate and not full and state.score_cache.get(cache_key(split, skill)) is None:
        current = need(state.current_score, "the current score")
        scores, blob, usage, partial = evaluate_early(ctx, state, skill, split, current)
        return [CandidateEvaluated(step=p.step, split=split, skill=skill, scores=scores, cached=False, results=blob,
                                   usage_by_role=usage, partial=partial)]
    scores, maybe_blob, usage = evaluate_cached(ctx, state, skill, split)
    return [CandidateEvaluated(step=p.step, split=split, skill=skill, scores=scores, cached=maybe_blob is None,
                               results=maybe_blob, usage_by_role=usage)]


def evaluation_order(ctx: RunContext, state: RunState, split: str) -> list[dict[str, Any]]:
    """The split's items, those the current skill failed first (from its
    recorded results, when the log has them), each group in split order;
    with `eval_order: hardness`, each group puts first the items that the
    skills the run made current so far (the initial one included) failed
    most often. Only those: their full results are in the log whether early
    reject is on or off, so the order is the same either way (a rejected
    candidate is scored in full only with early reject off)."""
    items = ctx.env.items(split)
    blob = state.results_cache.get(cache_key(split, state.current_skill or ""))
    if not blob:
        return items
    failed = {r["item_id"] for r in json.loads(ctx.blob(blob)) if r.get("hard", 0) < 1}
    misses: Counter[str] = Counter()
    if ctx.config.eval_order == "hardness":
        held = dict.fromkeys(s for s in (state.start_skill, *(r.current_skill for r in state.history),
                                         state.current_skill) if s)
        for skill in held:
            key = cache_key(split, skill)
            found = state.results_cache.get(key) or state.slow_results.get(key)
            if found:
                misses.update(r["item_id"] for r in json.loads(ctx.blob(found)) if r.get("hard", 0) < 1)
    rank = {i["id"]: (i["id"] not in failed, -misses[i["id"]], n) for n, i in enumerate(items)}
    return sorted(items, key=lambda i: rank[i["id"]])


def evaluate_early(ctx: RunContext, state: RunState, skill_hash: str, split: str,
                   current: float) -> tuple[Scores, str, dict[str, Usage], PartialEval | None]:
    """Score `skill_hash` on `split`, stopping once a reject is certain
    (`gate.early_reject_point`). Items go out in `evaluation_order`, up to
    `concurrency` at a time; no new item is sent once the scored prefix
    proves the reject, and the calls in flight finish and are recorded (a
    later full evaluation is served them). The event holds exactly that
    prefix, so resume and verify reproduce it whatever the timing. Without
    a reject every item is scored and the results are in split order, as a
    plain evaluation gives."""
    cfg = ctx.config
    skill = ctx.blob(skill_hash)
    order = evaluation_order(ctx, state, split)
    n = len(order)
    results: list[ItemResult | None] = [None] * n
    width = 1 if ctx.verifying else cfg.concurrency  # verify asks only for what the event holds
    pending: dict[Future[ItemResult], int] = {}
    sent = done = 0
    stop: tuple[int, float] | None = None
    check = reject_check(ctx, state, split, order, skill, current)
    reach, reach_at = width, -1  # how far past the scored prefix items go out (`send_limit`), for `done` at reach_at
    ctx.expect_calls(ctx.rollout_calls(n))
    with ctx.burst(n):
        while (sent < n and stop is None) or pending:
            if reach_at != done:
                reach, reach_at = send_limit(check, order, [r for r in results[:done] if r is not None], width), done
            while sent < n and stop is None and len(pending) < width and sent < done + reach:
                pending[ctx.submit(rollout_one, ctx, skill, order[sent])] = sent
                sent += 1
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                results[pending.pop(future)] = future.result()
            while stop is None and done < n and results[done] is not None:
                done += 1
                stop = check([r for r in results[:done] if r is not None])
    scored = [r for r in (results[: stop[0]] if stop else results) if r is not None]
    check_rollout_errors(ctx, scored)
    partial = None
    if stop is not None:
        partial = PartialEval(scored=stop[0], of=n, upper_bound=stop[1], item_ids=[r.item_id for r in scored])
    else:  # a full evaluation: in split order, exactly what a plain one records
        by_id = {r.item_id: r for r in scored}
        scored = [by_id[i["id"]] for i in ctx.env.items(split)]
    scores = summarize(scored, cfg.gate_metric, cfg.gate_mixed_weight, skill, cfg.semantic_density_weight,
                       cfg.gate_length_penalty)
    blob = ctx.put_blob(canonical_json([r.model_dump(mode="json") for r in scored]))
    return scores, blob, usage_of([c for r in scored for c in r.all_calls()]), partial


def send_limit(check: Callable[[list[ItemResult]], tuple[int, float] | None], order: list[dict[str, Any]],
               prefix: list[ItemResult], width: int) -> int:
    """How many items past the scored `prefix` (in `order`) may be out at
    once with none of them going unused at an early reject: the fewest
    further items whose failing would prove the reject, at most `width`. A
    failure is the outcome that favours a reject most under every rule, so
    a reject cannot come sooner. Only the calls sent depend on this, never
    what the evaluation records."""
    tail: list[ItemResult] = []
    for item in order[len(prefix): len(prefix) + width]:
        tail.append(ItemResult(item_id=item["id"], task_type=item.get("task_type", ""), hard=0.0, soft=0.0))
        if check(prefix + tail) is not None:
            return len(tail)
    return width


def reject_check(ctx: RunContext, state: RunState, split: str, order: list[dict[str, Any]], skill: str,
                 current: float) -> Callable[[list[ItemResult]], tuple[int, float] | None]:
    """Early reject's rule: given the scored prefix (in `order`), (its
    length, the score bound) once it proves that `skill` cannot beat
    `current`, else None."""
    cfg = ctx.config
    density = gate_rules.semantic_density(skill)
    cost = gate_rules.length_cost(skill, cfg.gate_length_penalty)
    if gating.rule_of(cfg).active:  # gate_rule paired or gate_type_margin: their exact bound
        return gating.early_check(ctx, state, split, order, current, density, cost)
    n = len(order)

    def check(prefix: list[ItemResult]) -> tuple[int, float] | None:
        found = gate_rules.early_reject_point([(r.hard, r.soft) for r in prefix], n, current, cfg.gate_metric,
                                              cfg.gate_mixed_weight, density, cfg.semantic_density_weight, cost)
        return found if found is not None and found[0] == len(prefix) else None

    return check


def early_prefix(ctx: RunContext, state: RunState, split: str, skill_hash: str,
                 results: dict[str, ItemResult]) -> list[str]:
    """The ids of the items early reject scores of `skill_hash` on `split`
    before it stops (every item, when it never does), read off `results`:
    those of a full evaluation, or the prefix an early reject recorded
    (which gives the same answer). For the repair's `repair_prefix`."""
    order = evaluation_order(ctx, state, split)
    check = reject_check(ctx, state, split, order, ctx.blob(skill_hash),
                         need(state.current_score, "the current score"))
    prefix: list[ItemResult] = []
    for item in order:
        if item["id"] not in results:  # past a recorded early reject's prefix (its check stopped before)
            break
        prefix.append(results[item["id"]])
        if check(prefix) is not None:
            break
    return [r.item_id for r in prefix]


def evaluate_cached(ctx: RunContext, state: RunState, skill: str,
                    split: str) -> tuple[Scores, str | None, dict[str, Usage]]:
    """Scores of `skill` on `split`, from the score cache when it was scored
    before (then there is no results blob and no usage)."""
    cached = state.score_cache.get(cache_key(split, skill))
    if cached is None:
        return evaluate(ctx, skill, split)
    cfg = ctx.config
    gate = gate_rules.gate_of(cached, cfg.gate_metric, cfg.gate_mixed_weight, cfg.semantic_density_weight)
    return cached.model_copy(update={"gate": gate}), None, {}


def decide(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    current, best = need(state.current_score, "the current score"), need(state.best_score, "the best score")
    if ctx.config.mode == "bank":
        from skillstate.engine.bank import skip_reason as bank_skip_reason  # bank imports this module

        skip = bank_skip_reason(ctx.config, state)
    else:
        skip = skip_reason(state, ctx.config.update_mode)
    if skip:
        return [GateDecided(step=p.step, decision=gate_rules.SKIP, candidate_score=None, current_score=current,
                            best_score=best, reason=skip)]
    evaluation = need(p.evaluation, "CandidateEvaluated")
    candidate = need(p.candidate, "CandidateBuilt")
    cfg = ctx.config
    robust = gating.rule_of(cfg).active
    if evaluation.partial is not None:
        part = evaluation.partial
        if not robust:
            return [GateDecided(step=p.step, decision=gate_rules.REJECT, candidate_score=part.upper_bound,
                                current_score=current, best_score=best,
                                reason=early_reject_reason(part, current) + repair_note(p.repair))]
        early = gating.early_verdict(ctx, state, evaluation, evaluation.split, current)
        paired, guard = gating.recorded(early.paired, early.guard, cfg, bound=True)
        return [GateDecided(step=p.step, decision=gate_rules.REJECT, candidate_score=part.upper_bound,
                            current_score=current, best_score=best, rule=cfg.gate_rule, paired=paired,
                            type_guard=guard, reason=gating.early_reason(early, current, part.scored, part.of, cfg)
                            + repair_note(p.repair))]
    score = evaluation.scores.gate
    verdicts: gating.Verdicts = (None, None)
    if robust:
        found = gating.full_verdicts(ctx, state, evaluation.split, evaluation.skill, evaluation.scores,
                                     evaluation.results)
        decision, reason, forced = gating.decision(score, current, best, cfg.use_gate, *found, cfg)
        verdicts = gating.recorded(*found, cfg)
    else:
        decision, reason, forced = gate_decision(score, current, best, cfg.use_gate)
    if not candidate.changed:
        reason += "; candidate identical to the current skill"
    if candidate.status != "ok":
        reason += f"; the rewrite call failed ({candidate.status})"
    reason += repair_note(p.repair)
    return [GateDecided(step=p.step, decision=decision, candidate_score=score, current_score=current,
                        best_score=best, reason=reason, forced=forced, rule=cfg.gate_rule, paired=verdicts[0],
                        type_guard=verdicts[1])]


def early_reject_reason(part: PartialEval, current: float) -> str:
    return (f"at most {part.upper_bound:.4f} <= current {current:.4f}: rejected early, after {part.scored} of "
            f"{part.of} items")


def skip_reason(state: RunState, update_mode: str) -> str | None:
    """Why the step ends without a candidate, or None when it has one to gate."""
    p = step_progress(state)
    if p.merged is None:
        return None
    if update_mode == "full_rewrite" and p.merged.skill is None:
        return "no analyst wrote a usable skill"
    if update_mode != "full_rewrite" and not p.merged.edits:
        return "no edits survived aggregation"
    if p.selected is not None and not p.selected.edits:
        dropped = p.selected.dropped
        if dropped and len(dropped) == p.selected.candidates:
            reasons = Counter(d.reason for d in dropped)
            listed = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(reasons.items()))
            if "rejected_before" in reasons:  # drop_rejected_edits (older logs never have it: their text stays)
                return f"every proposed edit was left out before selection ({listed})"
            return f"every proposed edit would change nothing ({listed})"
        return "the autonomous learning rate chose 0 edits"
    return None


def gate_decision(score: float, current: float, best: float, use_gate: bool) -> tuple[str, str, bool]:
    """(decision, reason, forced). With the gate off every candidate is
    accepted (still as new best when it beats the best)."""
    decision = gate_rules.decide(score, current, best)
    if not use_gate and decision == gate_rules.REJECT:
        return gate_rules.ACCEPT, f"{score:.4f} <= current {current:.4f}; forced accept (use_gate: false)", True
    reason = {
        gate_rules.ACCEPT_BEST: f"{score:.4f} > best {best:.4f}",
        gate_rules.ACCEPT: f"{score:.4f} > current {current:.4f} (best {best:.4f})",
        gate_rules.REJECT: f"{score:.4f} <= current {current:.4f}",
    }[decision]
    return decision, reason, not use_gate


# --- end of run --------------------------------------------------------------


def test_eval(label: str) -> Callable[[RunContext, RunState], list[Event]]:
    def stage(ctx: RunContext, state: RunState) -> list[Event]:
        skill = need(state.start_skill if label == "baseline" else state.best_skill, f"the {label} skill")
        split = ctx.config.test_split
        scores, blob, usage = evaluate(ctx, skill, split)
        return [TestEvaluated(label=label, split=split, skill=skill, scores=scores, results=blob, usage_by_role=usage)]

    return stage


def eval_skill(ctx: RunContext, state: RunState) -> list[Event]:
    """An evaluation run: score its skill on its split; with `samples` G > 1,
    G distinct samples of every item (GRPO groups, `export-grpo`)."""
    split = state.eval_split or ctx.config.test_split
    skill = need(state.initial_skill, "the initial skill")
    if ctx.config.samples > 1:
        return [_sampled(ctx, skill, split)]
    scores, blob, usage = evaluate(ctx, skill, split)
    return [TestEvaluated(label="eval", split=split, skill=skill, scores=scores, results=blob, usage_by_role=usage)]


def _sampled(ctx: RunContext, skill_hash: str, split: str) -> TestEvaluated:
    """Every item of `split`, `samples` times (sample i's requests carry seed i); results item by item."""
    cfg, skill = ctx.config, ctx.blob(skill_hash)
    jobs = [(item, i) for item in ctx.env.items(split) for i in range(cfg.samples)]
    ctx.expect_calls(ctx.rollout_calls(len(jobs)))
    results = ctx.map(lambda job: rollout_one(ctx, skill, job[0], job[1]), jobs)
    check_rollout_errors(ctx, results)
    scores = summarize(results, cfg.gate_metric, cfg.gate_mixed_weight, skill, cfg.semantic_density_weight,
                       cfg.gate_length_penalty)
    blob = ctx.put_blob(canonical_json([r.model_dump(mode="json") for r in results]))
    return TestEvaluated(label="eval", split=split, skill=skill_hash, scores=scores, results=blob,
                         usage_by_role=usage_of([c for r in results for c in r.all_calls()]))


def complete(ctx: RunContext, state: RunState) -> list[Event]:
    return [RunCompleted(steps=state.last_completed_step, best_step=state.best_step,
                         best_score=need(state.best_score, "the best score"),
                         current_score=need(state.current_score, "the current score"),
                         best_skill=need(state.best_skill, "the best skill"))]
