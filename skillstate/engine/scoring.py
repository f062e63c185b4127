"""Scoring a skill on items: one rollout, a batch of them, a split's scores
(`evaluate`, or from the score cache), and the exact early reject's
evaluation, which scores items in `evaluation_order` and stops once a
reject is proved, with no more items in flight than the reject could still
need (`send_limit`). The stages (`engine.stages`), the repair, the slow
update, pruning and the work done ahead score skills through these."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from skillstate.bank.document import prompt_for, retrieval_texts
from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.llm.base import CircuitOpen
from skillstate.log.events import ItemResult, PartialEval, RetrievedSkill, Scores, SplitScore, Usage, usage_of
from skillstate.log.reducer import RunState, cache_key, need
from skillstate.skillopt import gate as gate_rules
from skillstate.skillopt.tree_edits import md_of
from skillstate.util import canonical_json


def rollout_one(ctx: RunContext, skill: str, item: dict[str, Any], sample: int | None = None,
                prompt: tuple[str, list[RetrievedSkill]] | None = None) -> ItemResult:
    """One item rolled out with `skill` (as sample `sample` of several: its
    requests carry that index as their seed), where the run's executor runs
    rollouts. An environment that raises stops the run (EnvFailure); an LLM
    stop raised inside the rollout passes through. In bank mode, `prompt` is
    the item's system prompt and its skills when the caller has them."""
    retrieved: list[RetrievedSkill] = []
    if ctx.config.mode == "bank":  # the skill is the bank: this task sees the skills retrieved for it
        skill, retrieved = prompt or prompt_for(skill, item, ctx.config.bank, ctx.embedder)
    out = ctx.executor.rollout(ctx, skill, item, sample)
    stored = out.trajectory if out.trajectory is not None else out.messages
    for text in out.blobs.values():  # what the trajectory names (a workspace's record), stored with it
        ctx.put_blob(text)
    return ItemResult(
        item_id=item["id"], task_type=out.task_type, hard=out.hard, soft=out.soft, fail_reason=out.fail_reason,
        prediction=out.prediction, trajectory=ctx.put_blob(canonical_json(stored)),
        call=out.call.ref if out.call else None, calls=[c.ref for c in out.calls], turns=out.turns,
        seed=out.seed, retrieved=retrieved, sample=sample, skills_loaded=out.skills_loaded, files_read=out.files_read,
    )


def prime_retrieval(ctx: RunContext, skill: str, items: list[dict[str, Any]]) -> None:
    """Mode bank with embedding retrieval: embed in batched requests what
    the retrieval of `items` will ask for one text at a time (a journaled
    embedder's `prime`; what each rollout retrieves does not change)."""
    prime = getattr(ctx.embedder, "prime", None)
    if ctx.config.mode == "bank" and prime is not None and items:
        prime(retrieval_texts(skill, items, ctx.config.bank))


def rollout_items(ctx: RunContext, skill: str, items: list[dict[str, Any]]) -> list[ItemResult]:
    """Every item rolled out with `skill`, in input order. Episodes end at
    their first failed target call, so besides the calls' circuit breaker,
    too large a share of rollouts ended by failed calls stops the stage too
    (CircuitOpen), before anything is appended."""
    return rollout_jobs(ctx, skill, [(item, None) for item in items])


def rollout_jobs(ctx: RunContext, skill: str, jobs: list[tuple[dict[str, Any], int | None]]) -> list[ItemResult]:
    """Each (item, sample) rolled out with `skill`; results in input order.
    In bank mode, where each item's system prompt is the skills retrieved
    for it, the rollouts go out sorted by that prompt, so those that share
    it are sent together and a model server's prompt cache can serve it
    (what is recorded does not depend on the order sent)."""
    ctx.expect_calls(ctx.rollout_calls(len(jobs)))
    prompts: dict[str, tuple[str, list[RetrievedSkill]]] = {}
    order = list(range(len(jobs)))
    with ctx.burst(len(jobs)):  # one burst for both maps: no work ahead takes the slots between them
        if ctx.config.mode == "bank" and len(jobs) > 1:
            items = list({item["id"]: item for item, _ in jobs}.values())
            prime_retrieval(ctx, skill, items)
            found = ctx.map(lambda item: prompt_for(skill, item, ctx.config.bank, ctx.embedder), items)
            prompts = {item["id"]: p for item, p in zip(items, found, strict=True)}
            order.sort(key=lambda n: prompts[jobs[n][0]["id"]][0])  # stable: input order among equal prompts
        done = ctx.map(lambda n: rollout_one(ctx, skill, jobs[n][0], jobs[n][1], prompts.get(jobs[n][0]["id"])),
                       order)
    at = {n: result for n, result in zip(order, done, strict=True)}
    results = [at[n] for n in range(len(jobs))]
    check_rollout_errors(ctx, results)
    return results


def rollout_pairs(ctx: RunContext, pairs: list[tuple[str, dict[str, Any]]]) -> list[ItemResult]:
    """Each (skill text, item) rolled out, in input order: the ablations and screens that try several skills
    on a few items each (the repair, the blocker search, the minibatch screen). The same failure checks as
    `rollout_items`."""
    ctx.expect_calls(ctx.rollout_calls(len(pairs)))
    done = ctx.map(lambda pair: rollout_one(ctx, pair[0], pair[1]), pairs)
    check_rollout_errors(ctx, done)
    return done


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
    text = md_of(skill)  # a trained tree: SKILL.md, what the target reads whenever it loads the skill
    density = gate_rules.semantic_density(text)  # always stored: a fork may turn the bonus on later
    cost = gate_rules.length_cost(text, length_penalty)
    return Scores(
        hard=hard, soft=soft, n=len(results), density=density, length_cost=cost,
        gate=gate_rules.with_density(gate_rules.gate_score(hard, soft, metric, weight), density, density_weight,
                                     cost),
        by_task_type={t: SplitScore(hard=mean([r.hard for r in rs]), soft=mean([r.soft for r in rs]), n=len(rs))
                      for t, rs in sorted(groups.items())},
    )


def evaluate(ctx: RunContext, skill_hash: str, split: str) -> tuple[Scores, str, dict[str, Usage]]:
    skill = ctx.skill(skill_hash)
    results = rollout_items(ctx, skill, ctx.env.items(split))
    cfg = ctx.config
    scores = summarize(results, cfg.gate_metric, cfg.gate_mixed_weight, skill, cfg.semantic_density_weight,
                       cfg.gate_length_penalty)
    blob = ctx.put_blob(canonical_json([r.model_dump(mode="json") for r in results]))
    return scores, blob, usage_of([c for r in results for c in r.all_calls()])


def evaluation_order(ctx: RunContext, state: RunState, split: str) -> list[dict[str, Any]]:
    """The split's items, those the current skill failed first (from its
    recorded results, when the log has them), each group in split order;
    with `eval_order: hardness`, each group puts first the items that the
    skills the run made current so far (the initial one included) failed
    most often. Only those: their full results are in the log whether early
    reject is on or off, so the order is the same either way (a rejected
    candidate is scored in full only with early reject off). With
    `eval_order: split`, the split's order."""
    items = ctx.env.items(split)
    blob = state.results_cache.get(cache_key(split, state.current_skill or ""))
    if not blob or ctx.config.eval_order == "split":
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
    skill = ctx.skill(skill_hash)
    order = evaluation_order(ctx, state, split)
    n = len(order)
    results: list[ItemResult | None] = [None] * n
    width = 1 if ctx.verifying else cfg.concurrency  # verify asks only for what the event holds
    pending: dict[Future[ItemResult], int] = {}
    sent = done = 0
    stop: tuple[int, float] | None = None
    check = reject_check(ctx, state, split, order, skill, current)
    prefix: list[ItemResult] = []  # results[:done], the scored prefix in `order`
    failed = failed_outcomes(order)  # (for `send_limit`)
    reach, reach_at = width, -1  # how far past the scored prefix items go out (`send_limit`), for `done` at reach_at
    ctx.expect_calls(ctx.rollout_calls(n))
    prime_retrieval(ctx, skill, order)  # (the items past an early reject too: a query's vector serves every skill)
    with ctx.burst(n):
        while (sent < n and stop is None) or pending:
            if reach_at != done:
                reach, reach_at = send_limit(check, failed, prefix, width), done
            while sent < n and stop is None and len(pending) < width and sent < done + reach:
                pending[ctx.submit(rollout_one, ctx, skill, order[sent])] = sent
                sent += 1
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                results[pending.pop(future)] = future.result()
            while stop is None and done < n and results[done] is not None:
                prefix.append(results[done])  # type: ignore[arg-type]  # (not None: checked above)
                done += 1
                stop = check(prefix)
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


def failed_outcomes(order: list[dict[str, Any]]) -> list[ItemResult]:
    """Each item of `order` scored as a failure: what `send_limit` assumes of the items past the prefix."""
    return [ItemResult(item_id=item["id"], task_type=item.get("task_type", ""), hard=0.0, soft=0.0) for item in order]


def send_limit(check: Callable[[list[ItemResult]], tuple[int, float] | None], failed: list[ItemResult],
               prefix: list[ItemResult], width: int) -> int:
    """How many items past the scored `prefix` (of the evaluation order,
    whose items `failed` holds scored as failures) may be out at once with
    none of them going unused at an early reject: the fewest further items
    whose failing would prove the reject, at most `width`. A
    failure is the outcome that favours a reject most under every rule, so
    a reject cannot come sooner. Only the calls sent depend on this, never
    what the evaluation records."""
    tail = list(prefix)
    for failure in failed[len(prefix): len(prefix) + width]:
        tail.append(failure)
        if check(tail) is not None:
            return len(tail) - len(prefix)
    return width


def reject_check(ctx: RunContext, state: RunState, split: str, order: list[dict[str, Any]], skill: str,
                 current: float) -> Callable[[list[ItemResult]], tuple[int, float] | None]:
    """Early reject's rule: given the scored prefix (in `order`), (its
    length, the score bound) once it proves that `skill` cannot beat
    `current`, else None."""
    cfg = ctx.config
    density = gate_rules.semantic_density(md_of(skill))  # as `summarize` counts them
    cost = gate_rules.length_cost(md_of(skill), cfg.gate_length_penalty)
    if gating.rule_of(cfg).active:  # gate_rule paired or gate_type_margin: their exact bound
        return gating.early_check(ctx, state, split, order, current, density, cost)
    n = len(order)

    def check(prefix: list[ItemResult]) -> tuple[int, float] | None:
        # (the callers extend the prefix an item at a time and stop at the first proof: `gate.reject_after`)
        return gate_rules.reject_after([(r.hard, r.soft) for r in prefix], n, current, cfg.gate_metric,
                                       cfg.gate_mixed_weight, density, cfg.semantic_density_weight, cost)

    return check


def early_prefix(ctx: RunContext, state: RunState, split: str, skill_hash: str,
                 results: dict[str, ItemResult]) -> list[str]:
    """The ids of the items early reject scores of `skill_hash` on `split`
    before it stops (every item, when it never does), read off `results`:
    those of a full evaluation, or the prefix an early reject recorded
    (which gives the same answer). For the repair's `repair_prefix`."""
    order = evaluation_order(ctx, state, split)
    check = reject_check(ctx, state, split, order, ctx.skill(skill_hash),
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
