"""The final selection (`final_selection.enabled`), after training and any
final validation, before the test evaluation: the top accepted skills are
re-scored on the held-out selection split, one stage each
(`SelectionScored`, so a resume redoes at most one), then the best there
becomes the run's final skill (`FinalSelected`). The selection split never
reaches the gate: it is a split of its own (named in the data, or carved
from val or train when the run was created)."""

from __future__ import annotations

from skillstate.config import SkillConfig
from skillstate.engine.context import RunContext
from skillstate.engine.scoring import evaluate_cached
from skillstate.log.events import Event
from skillstate.log.reducer import RunState, cache_key, need
from skillstate.log.selection_events import Candidate, FinalSelected, SelectionScored
from skillstate.skillopt import final_selection as rules
from skillstate.skillopt import gate as gate_rules


def accepted_skills(config: SkillConfig, state: RunState) -> list[rules.Accepted]:
    """Every skill that was the current or best skill, in the order it became
    so, with its val gate score (under the run's gate metric) from the log."""
    spe = state.steps_per_epoch
    found: list[tuple[int, str | None]] = [(0, state.start_skill)]
    found += [(rec.step, rec.current_skill) for rec in state.history if rec.decision in gate_rules.ACCEPTED]
    found += [((epoch - 1) * spe, skill) for epoch, skill in sorted(state.epoch_skills.items())]
    found += [(state.best_step, state.best_skill), (state.last_completed_step, state.current_skill)]
    out = []
    for step, skill in sorted(found, key=lambda f: f[0]):  # stable: a step's skill before the one after it
        cached = state.score_cache.get(cache_key(config.val_split, skill or ""))
        if skill is not None and cached is not None:
            val = gate_rules.gate_of(cached, config.gate_metric, config.gate_mixed_weight,
                                     config.semantic_density_weight)  # the length cost too, as the gate
            out.append(rules.Accepted(skill=skill, step=step, val=val))
    return out


def candidates(config: SkillConfig, state: RunState) -> list[rules.Accepted]:
    """The skills to re-score, the best on val first (`final_selection.ranked`)."""
    best = need(state.best_skill, "the best skill")
    return rules.ranked(accepted_skills(config, state), best, config.final_selection.top)


def next_selection_stage(config: SkillConfig, state: RunState) -> str | None:
    """The final selection's stage due now, or None (off, or done)."""
    if not config.final_selection.enabled or state.final_selection is not None:
        return None
    return "final_score" if len(state.selection_scored) < len(candidates(config, state)) else "final_select"


def score_candidate(ctx: RunContext, state: RunState) -> list[Event]:
    """The next candidate scored on the selection split (the recorder serves
    requests already made; a skill scored there before comes from the cache)."""
    cfg = ctx.config
    rank = len(state.selection_scored)
    cand = candidates(cfg, state)[rank]
    split = rules.selection_split(cfg.final_selection)
    scores, blob, usage = evaluate_cached(ctx, state, cand.skill, split)
    return [SelectionScored(rank=rank, skill=cand.skill, from_step=cand.step, val_score=cand.val, split=split,
                            scores=scores, cached=blob is None, results=blob, usage_by_role=usage)]


def select_final(ctx: RunContext, state: RunState) -> list[Event]:
    scored = state.selection_scored
    chosen = rules.choose([s.scores.gate for s in scored])
    pick, best = scored[chosen], scored[0]
    if chosen == 0:
        reason = (f"the best on val (step {best.from_step}, val {best.val_score:.4f}) is also the best of "
                  f"{len(scored)} on {pick.split}: {pick.scores.gate:.4f}")
    else:
        reason = (f"step {pick.from_step}'s skill scores {pick.scores.gate:.4f} on {pick.split}, above the best on val "
                  f"(step {best.from_step}: {best.scores.gate:.4f}); val {pick.val_score:.4f} vs {best.val_score:.4f}")
    return [FinalSelected(split=pick.split, chosen=chosen, skill=pick.skill, from_step=pick.from_step,
                          val_score=pick.val_score, selection_score=pick.scores.gate, best_val=best.val_score,
                          candidates=[Candidate(skill=s.skill, step=s.from_step, val_score=s.val_score,
                                                selection_score=s.scores.gate) for s in scored],
                          reason=reason)]
