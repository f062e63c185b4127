"""The stages of a policy training run (kind policy): train a stretch with
TRL, and, for GRPO, SkillRL's recursive evolution: every
`policy.validation_interval` steps (and before the first and after the
last) the policy is scored on val with the bank, per category; the
categories below `bank.evolution_threshold` are evolved by the teacher (a
journaled optimizer call) from the policy's failures on train items, and
the evolved bank is kept only when the policy scores strictly better with
it on val. The training prompts are built with the bank as it stands."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from typing import Any

from skillstate.bank.document import bank_text, prompt_for, read_bank
from skillstate.bank.evolution import categories_to_evolve, failure_sample_plan
from skillstate.config import SkillConfig
from skillstate.engine.bank import admit, item_views, known_categories, parsed_reply, teacher_reply
from skillstate.engine.context import RunContext
from skillstate.engine.policy_model import LocalPolicy, checkpoint_sha256, model_identity, require_training_libraries
from skillstate.engine.policy_train import train_stretch
from skillstate.engine.prompting import compose, to_json
from skillstate.engine.scoring import prime_retrieval, summarize
from skillstate.envs import QAEnv
from skillstate.errors import ConfigError, SkillstateError, TrainingFailure, UserError
from skillstate.log.events import Event, ItemResult
from skillstate.log.events_policy import Checkpoint, PolicyBankEvolved, PolicyTrained, PolicyValidated
from skillstate.log.reducer import RunState, need
from skillstate.log.state import PolicyProgress
from skillstate.skillopt import gate as gate_rules
from skillstate.util import canonical_json, first_line, seeded_rng, sha256_text


@contextlib.contextmanager
def _failing_as(what: str) -> Iterator[None]:
    """A failure of the trainer or the local model, as one line that stops the run (resumable once fixed)."""
    try:
        yield
    except (SkillstateError, KeyboardInterrupt):
        raise
    except Exception as err:
        raise TrainingFailure(f"{what} failed: {type(err).__name__}: {first_line(err, 'no message')}") from err


def finite_metrics(row: dict[str, float]) -> dict[str, float]:
    """A logged row as the log can hold it: a metric that is NaN or infinite (other than the loss, which stops
    the run) is left out, and `nonfinite` counts those left out."""
    kept = {k: v for k, v in row.items() if math.isfinite(v)}
    return kept if len(kept) == len(row) else {**kept, "nonfinite": float(len(row) - len(kept))}


def _policy(state: RunState) -> PolicyProgress:
    return need(state.policy, "PolicyStarted")


def validation_due(cfg: SkillConfig, p: PolicyProgress) -> bool:
    """The policy is scored before the first step, every validation_interval steps, and after the last."""
    if any(v.step == p.step for v in p.validated):
        return False
    return p.step == 0 or p.step % cfg.policy.validation_interval == 0 or p.step >= cfg.policy.max_steps


def next_policy_stage(cfg: SkillConfig, state: RunState) -> str | None:
    p = _policy(state)
    if validation_due(cfg, p):
        return "policy_validate"
    evolving = (p.started.method == "grpo" and cfg.mode == "bank" and cfg.policy.evolve
                and 0 < p.step < cfg.policy.max_steps)
    if evolving and p.validated and p.validated[-1].step == p.step and not any(e.step == p.step for e in p.evolved):
        return "policy_evolve"
    if p.step < cfg.policy.max_steps:
        return "policy_train"
    return None if state.completed else "complete"


def stretch_end(cfg: SkillConfig, p: PolicyProgress) -> int:
    """The step the next stretch trains up to: the next checkpoint, validation or the end, whichever is first."""
    pc = cfg.policy
    ends = [pc.max_steps, (p.step // pc.save_steps + 1) * pc.save_steps,
            (p.step // pc.validation_interval + 1) * pc.validation_interval]
    return min(ends)


def _unchanged(path: str, recorded: str, digest, what: str) -> str:
    """`path`, when `digest(path)` is still the hash the run recorded; a one-line error when it is missing or
    changed."""
    try:
        found = digest(path)
    except (OSError, ConfigError):
        found = None
    if found != recorded:
        raise UserError(f"{what} at {path} is missing or changed since it was written (its files' hash differs): "
                        "put it back, or start a new run")
    return path


def _resume_from(p: PolicyProgress) -> str | None:
    """The last checkpoint, checked against the hash its event recorded."""
    ck = p.checkpoint
    if ck is None:
        return None
    return _unchanged(ck.path, ck.sha256, checkpoint_sha256, f"the checkpoint of step {ck.step}")


def _base(p: PolicyProgress) -> str:
    """The base model's folder, checked against the identity the run recorded."""
    require_training_libraries()  # a resume on a machine without the train extra: one line
    base = p.started.base_model
    return _unchanged(base.path, base.sha256, lambda path: model_identity(path).sha256, "the base model")


def _qa(ctx: RunContext) -> QAEnv:
    """GRPO's environment: a question-answering kind (checked when the run was created)."""
    if not isinstance(ctx.env, QAEnv):
        raise UserError(f"grpo needs a question-answering environment, not {ctx.config.env!r}")
    return ctx.env


def _system(ctx: RunContext, skill: str, item: dict[str, Any]) -> tuple[str, list[Any]]:
    """What a task is shown: the skills the bank retrieves for it (mode bank), or the skill document."""
    if ctx.config.mode == "bank":
        return prompt_for(skill, item, ctx.config.bank, ctx.embedder)
    return skill, []


def grpo_rows(ctx: RunContext, skill_hash: str) -> list[dict[str, Any]]:
    """One prompt per train item: the skills the bank gives it (retrieval as in mode bank) or the skill
    document as the system message, and the environment's question."""
    skill = ctx.skill(skill_hash)
    rows = []
    prime_retrieval(ctx, skill, ctx.env.items(ctx.config.train_split))
    for item in ctx.env.items(ctx.config.train_split):
        system, _ = _system(ctx, skill, item)
        user = _qa(ctx).user_message(item, ctx.prompts)
        prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        rows.append({"prompt": prompt, "item_id": item["id"]})
    return rows


def reward_of(ctx: RunContext):
    """GRPO's reward: the environment's own scorer of each completion, as the run's gate metric."""
    cfg = ctx.config

    def reward(prompts: list[Any], completions: list[Any], item_id: list[str], **_: Any) -> list[float]:
        out = []
        for completion, iid in zip(completions, item_id, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            hard, soft, _reason = _qa(ctx).score(text, ctx.env.item(iid))
            out.append(gate_rules.gate_score(hard, soft, cfg.gate_metric, cfg.gate_mixed_weight))
        return out

    return reward


def policy_train(ctx: RunContext, state: RunState) -> list[Event]:
    p = _policy(state)
    cfg = ctx.config
    step_to = stretch_end(cfg, p)
    resume, base = _resume_from(p), _base(p)
    started = time.perf_counter()
    bank = prompts_sha = None
    reward = None
    if p.started.method == "sft":
        rows = [json.loads(line) for line in ctx.blob(need(p.started.dataset, "the SFT rows")).splitlines() if line]
    else:
        bank = need(state.current_skill, "the bank")
        rows = grpo_rows(ctx, bank)
        prompts_sha = sha256_text(canonical_json(rows))
        reward = reward_of(ctx)
    with _failing_as(f"training steps {p.step + 1} to {step_to}"):
        metrics, path = train_stretch(cfg=cfg.policy, base=base, method=p.started.method, seed=cfg.seed,
                                      output_dir=p.started.output_dir, rows=rows, reward=reward, step_to=step_to,
                                      resume=resume)
    diverged = sorted({k for m in metrics for k, v in m.items() if k in ("loss", "grad_norm") and
                       not math.isfinite(v)})
    if diverged:
        raise TrainingFailure(f"training diverged by step {step_to}: {' and '.join(diverged)} not finite; lower "
                              "policy.learning_rate and train a new policy run")
    metrics = [finite_metrics(m) for m in metrics]
    return [PolicyTrained(step_from=p.step, step_to=step_to, metrics=metrics, bank=bank, prompts_sha256=prompts_sha,
                          checkpoint=Checkpoint(step=step_to, path=path, sha256=checkpoint_sha256(path)),
                          seconds=round(time.perf_counter() - started, 3))]


def _score_items(ctx: RunContext, policy: LocalPolicy, bank: str, items: list[dict[str, Any]]) -> list[ItemResult]:
    """The policy's rollouts of `items` with the bank's skills (or the skill document, for a run in mode skill),
    judged by the environment (no journaled call: the policy runs here, and the results are what the event
    keeps)."""
    text = ctx.skill(bank)
    out = []
    prime_retrieval(ctx, text, items)
    for item in items:
        system, retrieved = _system(ctx, text, item)
        with _failing_as(f"the policy's rollout of {item['id']}"):
            done = ctx.env.rollout(system, item, policy.complete, ctx.prompts)
        stored = done.trajectory if done.trajectory is not None else done.messages
        out.append(ItemResult(item_id=item["id"], task_type=done.task_type, hard=done.hard, soft=done.soft,
                              fail_reason=done.fail_reason, prediction=done.prediction,
                              trajectory=ctx.put_blob(canonical_json(stored)), turns=done.turns, seed=done.seed,
                              retrieved=retrieved))
    return out


def _local(ctx: RunContext, p: PolicyProgress) -> LocalPolicy:
    pc = ctx.config.policy
    base, checkpoint = _base(p), _resume_from(p)
    with _failing_as(f"loading the policy ({checkpoint or base})"):
        return LocalPolicy(base, checkpoint, pc.eval_max_new_tokens, pc.torch_threads)


def _summary(ctx: RunContext, results: list[ItemResult]):
    cfg = ctx.config
    return summarize(results, cfg.gate_metric, cfg.gate_mixed_weight)


def _blob(ctx: RunContext, results: list[ItemResult]) -> str:
    return ctx.put_blob(canonical_json([r.model_dump(mode="json") for r in results]))


def policy_validate(ctx: RunContext, state: RunState) -> list[Event]:
    p = _policy(state)
    bank, split = need(state.current_skill, "the bank"), ctx.config.val_split
    results = _score_items(ctx, _local(ctx, p), bank, ctx.env.items(split))
    return [PolicyValidated(step=p.step, split=split, skill=bank, scores=_summary(ctx, results),
                            results=_blob(ctx, results))]


def policy_evolve(ctx: RunContext, state: RunState) -> list[Event]:
    p = _policy(state)
    cfg, bcfg = ctx.config, ctx.config.bank
    validated = p.validated[-1]
    base = need(state.current_skill, "the bank")
    rates = {t: s.hard for t, s in validated.scores.by_task_type.items()}
    weak = categories_to_evolve(rates, bcfg.evolution_threshold)
    if not weak:
        return [PolicyBankEvolved(step=p.step, rates=rates, categories=[], status="skipped", base_skill=base,
                                  base_score=validated.scores.gate)]
    policy = _local(ctx, p)
    rng = seeded_rng("policy-evolve", cfg.seed, p.step)
    pool = [i for i in ctx.env.items(cfg.train_split) if (i.get("task_type") or i.get("category")) in weak]
    rng.shuffle(pool)
    tried = _score_items(ctx, policy, base, pool[: 4 * bcfg.evolve_samples])  # the policy's own train failures
    failed: dict[str, list[str]] = {}
    for r in tried:
        if r.hard < 1:
            failed.setdefault(r.task_type or "untyped", []).append(r.item_id)
    samples = failure_sample_plan(rates, failed, bcfg.evolution_threshold, bcfg.evolve_samples)
    if not samples:  # the policy failed no train item of those categories it tried: nothing to show the teacher
        return [PolicyBankEvolved(step=p.step, rates=rates, categories=weak, status="no_failures", base_skill=base,
                                  base_score=validated.scores.gate, failures=_blob(ctx, tried))]
    by_id = {r.item_id: r for r in tried}
    shown = [by_id[i] for ids in samples.values() for i in ids]
    bank = read_bank(ctx.blob(base))
    prompt = compose(ctx, state, "evolve", bank=to_json(bank.model_dump(mode="json")), categories=", ".join(weak),
                     known_categories=", ".join(known_categories(ctx)),
                     rates=to_json({t: round(r, 3) for t, r in sorted(rates.items())}),
                     failures=to_json(item_views(ctx, shown)), max_new=bcfg.max_new_skills)
    shape = teacher_reply(ctx, "evolve")
    result = ctx.optimizer(prompt, reply=shape)
    status, reply = parsed_reply(result, shape)
    added, dropped = admit(ctx, bank, reply, "evolve", p.step, [r.item_id for r in shown]) if reply else ([], [])
    event = PolicyBankEvolved(step=p.step, rates=rates, categories=weak, samples=samples, status=status, added=added,
                              dropped=dropped, call=result.ref, base_skill=base, base_score=validated.scores.gate,
                              failures=_blob(ctx, tried))
    if not added:
        return [event]
    candidate = ctx.put_blob(bank_text(bank.with_skills(added)))
    results = _score_items(ctx, policy, candidate, ctx.env.items(cfg.val_split))
    score = _summary(ctx, results).gate
    return [event.model_copy(update={"candidate": candidate, "candidate_score": score,
                                     "accepted": score > validated.scores.gate,
                                     "candidate_results": _blob(ctx, results)})]
