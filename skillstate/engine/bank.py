"""The stages of a step in mode bank (SkillRL's skill bank): after the
rollout (collect), the teacher distills skills from the step's trajectories
into the bank; every `bank.validation_interval` steps (and at the last) the
bank is validated per category, the categories below
`bank.evolution_threshold` are evolved, and the evolved bank goes through
the gate like a candidate skill (`evaluate`, `gate`)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from skillstate.bank.dedup import DroppedSkill, dedupe
from skillstate.bank.document import bank_text, category_of, read_bank
from skillstate.bank.evolution import categories_to_evolve, failure_sample_plan
from skillstate.bank.skills import Bank, BankSkill, Mistake, Origin, SkillProvenance, normalize_text
from skillstate.bank.trajectories import Trajectory
from skillstate.config import SkillConfig
from skillstate.engine.context import RunContext, item_view
from skillstate.engine.parsing import parse_reply
from skillstate.engine.prompting import compose, to_json
from skillstate.engine.scoring import evaluate_cached
from skillstate.log.events import CandidateBuilt, Event, ItemResult
from skillstate.log.events_bank import BankEvolved, BankSeeded, BankValidated, SkillsDistilled
from skillstate.log.reducer import RunState, cache_key, need, step_progress
from skillstate.skillopt import gate as gate_rules
from skillstate.util import seeded_rng


class ProposedSkill(BaseModel):
    model_config = ConfigDict(extra="ignore")

    title: str = ""
    principle: str = ""
    when_to_apply: str = ""
    category: str | None = None
    refines: str | None = None


class ProposedMistake(BaseModel):
    model_config = ConfigDict(extra="ignore")

    text: str = ""
    category: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _bare_line(cls, data: Any) -> Any:
        return {"text": data} if isinstance(data, str) else data  # a bare line: a general mistake


class TeacherReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    skills: list[ProposedSkill]
    mistakes: list[ProposedMistake] = []


# The reply of runs whose distill prompt asks for mistakes as bare lines (every run before mistakes had
# categories): its JSON schema, sent with `optimizer.response_format: json_schema`, is byte for byte what they
# sent (no docstring: it would become the schema's description).
class LineMistakesReply(BaseModel):
    model_config = ConfigDict(extra="ignore", title="TeacherReply")

    skills: list[ProposedSkill]
    mistakes: list[str] = []


LineMistakesReply.__name__ = "TeacherReply"  # the schema's name those runs sent, so their requests hash as they did


class EvolveReply(BaseModel):  # what the evolve prompt asks for: skills (new, or refining one), no mistakes
    model_config = ConfigDict(extra="ignore")

    skills: list[ProposedSkill]


def teacher_reply(ctx: RunContext, phase: str) -> type[BaseModel]:
    """The reply shape the run's own prompt for `phase` (distill or evolve) asks for; a run whose distill prompt
    asks for mistakes as bare lines asked both in that one shape."""
    if '"mistakes": ["' in ctx.prompts["distill"]:
        return LineMistakesReply
    return TeacherReply if phase == "distill" else EvolveReply


def _mistakes(reply: TeacherReply | LineMistakesReply, known: list[str]) -> list[Mistake]:
    """The reply's mistakes, blanks skipped, each filed under the category the data spells (a category the data
    does not have, or none, makes it general)."""
    out = []
    for raw in reply.mistakes:
        proposed = ProposedMistake.model_validate(raw)
        category, ok = _category(proposed.category, known)
        if (mistake := Mistake.of(proposed.text)) is not None:
            out.append(Mistake(text=mistake.text, category=category if ok else None))
    return out


def validation_due(config: SkillConfig, state: RunState) -> bool:
    p = step_progress(state)
    return p.step % config.bank.validation_interval == 0 or p.step == state.total_steps


def next_bank_stage(config: SkillConfig, state: RunState) -> str:
    """The stage after a bank step's rollout."""
    p = step_progress(state)
    if p.distilled is None:
        return "distill"
    if not validation_due(config, state):
        return "gate"
    if p.validated is None:
        return "validate_bank"
    if p.evolved is None:
        return "evolve"
    if p.candidate is None:
        return "gate"
    return "evaluate" if p.evaluation is None else "gate"


def skip_reason(config: SkillConfig, state: RunState) -> str | None:
    """Why a bank step ends without a candidate bank to gate, or None."""
    p = step_progress(state)
    if p.distilled is None or p.candidate is not None:
        return None
    added = len(p.distilled.added)
    distilled = f"distilled {added} skill{'s' * (added != 1)} into the bank"
    v = p.validated
    if v is not None and v.kept is False:
        distilled += (f"; rolled back to the bank last validated (val {v.scores.gate:.3f} < "
                      f"{v.checked_score or 0.0:.3f})")
    if p.evolved is None:
        return f"{distilled}; the bank is validated every {config.bank.validation_interval} steps"
    if p.evolved.status == "skipped":
        return f"{distilled}; every category is at or above evolution_threshold {config.bank.evolution_threshold:g}"
    return f"{distilled}; evolution added nothing ({p.evolved.status})"


def item_views(ctx: RunContext, results: list[ItemResult]) -> list[dict[str, Any]]:
    return [item_view(ctx.env, r, json.loads(ctx.blob(need(r.trajectory, "a trajectory")))) for r in results]


GENERAL_NAMES = frozenset({"", "general", "null", "none", "any", "all"})


def known_categories(ctx: RunContext) -> list[str]:
    """The task categories of the run's data, every split."""
    cfg = ctx.config
    return sorted({c for split in (cfg.train_split, cfg.val_split, cfg.test_split) for item in ctx.env.items(split)
                   if (c := category_of(item))})


def _category(raw: str | None, known: list[str]) -> tuple[str | None, bool]:
    """(the category a teacher named, as the data spells it, or None for general; whether the data has it)."""
    if raw is None or normalize_text(raw) in GENERAL_NAMES:
        return None, True
    found = {normalize_text(k): k for k in known}.get(normalize_text(raw))
    return (found, True) if found else (raw.strip(), False)


def _proposals(reply: TeacherReply, origin: Origin, step: int, item_ids: list[str],
               known: list[str]) -> tuple[list[BankSkill], list[DroppedSkill]]:
    """The reply's skills, and those filed under a category the data does not have (never retrieved)."""
    out, unknown = [], []
    for s in reply.skills:
        category, ok = _category(s.category, known)
        try:
            skill = BankSkill.make(s.title.strip(), s.principle.strip(), category=category,
                                   when_to_apply=s.when_to_apply.strip(),
                                   provenance=SkillProvenance(trajectories=item_ids, origin=origin, step=step,
                                                              refines=s.refines or None))
        except ValidationError:
            continue  # a malformed proposal adds nothing
        if ok:
            out.append(skill)
        else:
            unknown.append(DroppedSkill(skill=skill, reason="unknown_category"))
    return out, unknown


def admit(ctx: RunContext, bank: Bank, reply: TeacherReply, origin: Origin, step: int,
          item_ids: list[str]) -> tuple[list[BankSkill], list[DroppedSkill]]:
    """The proposals of one teacher reply that the bank takes: deduplicated, at most max_new_skills."""
    cfg = ctx.config.bank
    proposed, unknown = _proposals(reply, origin, step, item_ids, known_categories(ctx))
    found = dedupe(bank, proposed, ctx.embedder.embed, cfg.dedup_threshold)
    added, over = found.added[: cfg.max_new_skills], found.added[cfg.max_new_skills:]
    return added, unknown + list(found.dropped) + [DroppedSkill(skill=s, reason="over_budget") for s in over]


def parsed_reply(result: Any, shape: type[BaseModel] = TeacherReply) -> tuple[str, TeacherReply | None]:
    """(status, reply) of a teacher call, read in the shape the run asked for (a run before categorized
    mistakes took a reply whose mistakes are not all lines as unparseable, and still does)."""
    if not result.ok:
        return "error", None
    found = parse_reply(result.text, shape)
    reply = TeacherReply.model_validate(found.model_dump()) if found is not None else None
    return ("ok", reply) if reply is not None else ("unparseable", None)


def _ask(ctx: RunContext, state: RunState, prompt: str, bank: Bank, origin: Origin,
         item_ids: list[str]) -> tuple[str, list[BankSkill], list[DroppedSkill], list[Mistake], Any]:
    """One teacher call: (status, added, dropped, mistakes, call ref)."""
    shape = teacher_reply(ctx, origin)
    result = ctx.optimizer(prompt, reply=shape)
    status, reply = parsed_reply(result, shape)
    if reply is None:
        return status, [], [], [], result.ref
    added, dropped = admit(ctx, bank, reply, origin, step_progress(state).step, item_ids)
    return status, added, dropped, _mistakes(reply, known_categories(ctx)), result.ref


def _trajectory_view(t: Trajectory, max_steps: int, max_chars: int) -> dict[str, Any]:
    steps = t.ordered_steps()
    shown = steps[-max_steps:]
    return {"id": t.id, "task": t.task_description, "task_type": t.task_category, "success": t.success,
            "total_reward": t.total_reward, "shown_steps": len(shown), "total_steps": len(steps),
            "steps": [{"observation": s.observation[:max_chars], "action": s.action, "reward": s.reward}
                      for s in shown]}


def seed_bank(ctx: RunContext, state: RunState) -> list[Event]:
    """Before the baseline: distill the imported trajectories into the bank,
    `minibatch_size` successes and failures per teacher call. The calls all
    see the starting bank and go out together; their proposals are then
    admitted in call order, each call's against the bank the ones before
    it left."""
    cfg = ctx.config
    trajectories = [Trajectory.model_validate(t) for t in json.loads(ctx.blob(need(state.trajectories, "them")))]
    k = cfg.minibatch_size
    wins, losses = [t for t in trajectories if t.success], [t for t in trajectories if not t.success]
    chunks = [(wins[i:i + k], losses[i:i + k]) for i in range(0, max(len(wins), len(losses)), k)]
    base = need(state.current_skill, "the initial bank")
    bank = start = read_bank(ctx.blob(base))
    ep = cfg.episode

    def prompt(chunk: tuple[list[Trajectory], list[Trajectory]]) -> str:
        views = [[_trajectory_view(t, ep.reflect_max_turns, ep.max_observation_chars) for t in side]
                 for side in chunk]
        return compose(ctx, state, "distill", bank=to_json(start.model_dump(mode="json")),
                       known_categories=", ".join(known_categories(ctx)), successes=to_json(views[0]),
                       failures=to_json(views[1]), max_new=cfg.bank.max_new_skills)

    shape = teacher_reply(ctx, "distill")
    results = ctx.map(lambda text: ctx.optimizer(text, reply=shape), [prompt(c) for c in chunks])
    statuses, added, dropped, mistakes = [], [], [], []
    for (won, lost), result in zip(chunks, results, strict=True):
        status, reply = parsed_reply(result, shape)
        statuses.append(status)
        if reply is None:
            continue
        new, gone = admit(ctx, bank, reply, "import", 0, [t.id for t in won + lost])
        seen = _mistakes(reply, known_categories(ctx))
        bank = bank.with_skills(new).with_mistakes(seen)
        added += new
        dropped += gone
        mistakes += seen
    skill = ctx.put_blob(bank_text(bank)) if bank != start else base
    return [BankSeeded(base_skill=base, skill=skill, statuses=statuses, added=added, dropped=dropped,
                       mistakes=mistakes, calls=[r.ref for r in results])]


def retrieval_warning(bank: Bank, results: list[ItemResult], retrieval: str) -> str | None:
    """What to warn of when a bank with skills gave none of a stage's rollouts any skill, or None."""
    if not bank.skills or not results or any(r.retrieved for r in results):
        return None
    hint = (" (bank.similarity_threshold is above every similarity: lower it, or set bank.min_retrieved)"
            if retrieval == "embedding" else " (no skill of their categories, and bank.general_k is 0)")
    return f"none of the {len(results)} rollouts was given a skill from the bank of {len(bank.skills)}{hint}"


def distill(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg = ctx.config
    results = need(p.rollout, "RolloutCompleted").results
    bank = read_bank(ctx.blob(p.base_skill))
    if (warning := retrieval_warning(bank, results, cfg.bank.retrieval)) is not None:
        ctx.warn(f"step {p.step}: {warning}")
    rng = seeded_rng("distill", cfg.seed, p.step)
    shown: dict[str, list[ItemResult]] = {}
    for side, keep in (("successes", True), ("failures", False)):
        side_results = [r for r in results if (r.hard >= 1) == keep]
        shown[side] = rng.sample(side_results, min(cfg.minibatch_size, len(side_results)))
    prompt = compose(ctx, state, "distill", bank=to_json(bank.model_dump(mode="json")),
                     known_categories=", ".join(known_categories(ctx)),
                     successes=to_json(item_views(ctx, shown["successes"])),
                     failures=to_json(item_views(ctx, shown["failures"])), max_new=cfg.bank.max_new_skills)
    ids = [r.item_id for side in shown.values() for r in side]
    status, added, dropped, mistakes, call = _ask(ctx, state, prompt, bank, "distill", ids)
    new = bank.with_skills(added).with_mistakes(mistakes)
    skill = ctx.put_blob(bank_text(new)) if new != bank else p.base_skill
    return [SkillsDistilled(step=p.step, base_skill=p.base_skill, skill=skill, status=status, added=added,
                            dropped=dropped, mistakes=mistakes, call=call)]


def validate_bank(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    split, skill = ctx.config.val_split, need(state.current_skill, "the current bank")
    scores, blob, usage = evaluate_cached(ctx, state, skill, split)
    checked, checked_score, kept = None, None, None
    before = state.score_cache.get(cache_key(split, state.bank_checked or ""))
    cfg = ctx.config
    if cfg.bank.gate_distillation and state.bank_checked not in (None, skill) and before is not None:
        # its score as this run's gate counts it (a fork may have changed the gate metric since it was cached)
        checked_score = gate_rules.gate_of(before, cfg.gate_metric, cfg.gate_mixed_weight,
                                           cfg.semantic_density_weight)
        checked, kept = state.bank_checked, scores.gate >= checked_score
    return [BankValidated(step=p.step, split=split, skill=skill, scores=scores, cached=blob is None, results=blob,
                          usage_by_role=usage, checked=checked, checked_score=checked_score, kept=kept)]


def _failure_pool(ctx: RunContext, state: RunState) -> list[ItemResult]:
    """The results whose failures the evolving teacher may be shown: the step's rollouts on train
    (`bank.evolve_from: train`), or the bank's validation on val, the split the evolved bank is gated on."""
    p = step_progress(state)
    if ctx.config.bank.evolve_from == "train":
        return list(need(p.rollout, "RolloutCompleted").results)
    validated = need(p.validated, "BankValidated")
    blob = state.results_cache.get(cache_key(validated.split, need(state.current_skill, "the current bank")))
    return [ItemResult.model_validate(r) for r in json.loads(ctx.blob(blob))] if blob else []


def evolve(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    cfg, bcfg = ctx.config, ctx.config.bank
    validated = need(p.validated, "BankValidated")
    scores = validated.scores
    if validated.kept is False:  # rolled back: the restored bank's own rates
        scores = need(state.score_cache.get(cache_key(validated.split, need(validated.checked, "a bank"))),
                      "the restored bank's scores")
    rates = {t: s.hard for t, s in scores.by_task_type.items()}
    weak = categories_to_evolve(rates, bcfg.evolution_threshold)
    if not weak:
        return [BankEvolved(step=p.step, rates=rates, categories=[], status="skipped", source=bcfg.evolve_from)]
    results = _failure_pool(ctx, state)
    failed: dict[str, list[str]] = {}
    for r in results:
        if r.hard < 1:
            failed.setdefault(r.task_type or "untyped", []).append(r.item_id)
    rng = seeded_rng("evolve", cfg.seed, p.step)
    for ids in failed.values():
        rng.shuffle(ids)
    samples = failure_sample_plan(rates, failed, bcfg.evolution_threshold, bcfg.evolve_samples)
    if not samples:  # no failure of those categories to learn from (train's batch had none): no teacher call
        return [BankEvolved(step=p.step, rates=rates, categories=weak, status="no_failures", source=bcfg.evolve_from)]
    by_id = {r.item_id: r for r in results}
    shown = [by_id[i] for ids in samples.values() for i in ids]
    bank = read_bank(ctx.blob(need(state.current_skill, "the current bank")))
    prompt = compose(ctx, state, "evolve", bank=to_json(bank.model_dump(mode="json")), categories=", ".join(weak),
                     known_categories=", ".join(known_categories(ctx)),
                     rates=to_json({t: round(r, 3) for t, r in sorted(rates.items())}),
                     failures=to_json(item_views(ctx, shown)), max_new=bcfg.max_new_skills)
    status, added, dropped, _unused, call = _ask(ctx, state, prompt, bank, "evolve", [r.item_id for r in shown])
    events: list[Event] = [BankEvolved(step=p.step, rates=rates, categories=weak, samples=samples, status=status,
                                       added=added, dropped=dropped, call=call, source=bcfg.evolve_from)]
    if added:
        base = need(state.current_skill, "the current bank")
        candidate = ctx.put_blob(bank_text(bank.with_skills(added)))
        events.append(CandidateBuilt(step=p.step, base_skill=base, skill=candidate, report=[], changed=True,
                                     method="evolve"))
    return events
