"""Pruning (config key `prune`): after each step, or at each epoch end,
propose deleting lines of the current skill that do not earn their place
and decide the deletions through the step gate.

The proposal joins two sources: a deterministic rule (a line that repeats
an earlier one exactly or nearly, `skillstate.skillopt.prune`) and one optimizer
call (the `prune` prompt), which sees each line with the step that added it
and that step's gain. The deletions are delete edits applied by the editor
(the slow-update block is never touched). The decision is the step gate's:
the same metric (with `gate_length_penalty`, if set), early reject, and the
robust rules (`gate_rule: paired`, `gate_type_margin`) when configured."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from skillstate.config import SkillConfig
from skillstate.engine import gating
from skillstate.engine.context import RunContext
from skillstate.engine.line_ablation import ablate
from skillstate.engine.parsing import parse_reply
from skillstate.engine.prompting import compose, to_json
from skillstate.engine.scoring import evaluate_cached, evaluate_early
from skillstate.engine.stages import early_reject_reason, gate_decision
from skillstate.engine.update import patch_with
from skillstate.log.events import Event
from skillstate.log.events_blocker import LineAblation
from skillstate.log.prune_events import PruneDecided, PruneLine, PruneProposed
from skillstate.log.reducer import RunState, cache_key, need
from skillstate.skillopt import blockers as blocker_rules
from skillstate.skillopt import gate as gate_rules
from skillstate.skillopt import prune as rules
from skillstate.skillopt.gate_robust import item_value
from skillstate.skillopt.guidance import body_of
from skillstate.skillopt.scheduler import position
from skillstate.skillopt.tree_edits import md_of


class PruneReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    reasoning: str = ""
    delete: list[str]


def due(cfg: SkillConfig, state: RunState) -> bool:
    """Whether a prune is due now (between steps, after the epoch boundary's work)."""
    if cfg.prune == "off" or cfg.mode != "skill" or state.progress is not None or state.boundary is not None:
        return False
    if state.prune is not None:
        return True
    last = state.last_completed_step
    if last == 0 or last <= state.pruned_step or state.steps_per_epoch == 0:
        return False
    return cfg.prune == "step" or last % state.steps_per_epoch == 0


def stage(state: RunState) -> str:
    return "prune_propose" if state.prune is None else "prune_decide"


def _changes(ctx: RunContext, state: RunState) -> list[tuple[int, float, str]]:
    """(step, gain, skill text) of each step that changed the current skill, in order."""
    out: list[tuple[int, float, str]] = []
    skill, score = state.start_skill, state.baseline.gate if state.baseline else None
    for rec in state.history:
        if rec.current_skill and rec.current_skill != skill:
            gain = (rec.current_score or 0.0) - (score or 0.0)
            out.append((rec.step, gain, md_of(ctx.skill(rec.current_skill))))
        skill, score = rec.current_skill, rec.current_score
    return out


def propose(ctx: RunContext, state: RunState) -> list[Event]:
    cfg = ctx.config
    after = state.last_completed_step
    epoch, _ = position(after, state.steps_per_epoch)
    base_hash = need(state.current_skill, "the current skill")
    base = ctx.skill(base_hash)
    body = body_of(md_of(base), front_matter=cfg.protect_front_matter)  # the lines of SKILL.md
    rejected = [line for skill, line in state.prune_rejected if skill == base_hash]  # not proposed again
    found: dict[str, PruneLine] = {}
    for line, reason, of in rules.rule_deletions(body):
        if line not in rejected:
            found.setdefault(line, PruneLine(line=line, reasons=[reason], of=of))
    evidence = rules.line_evidence(md_of(ctx.skill(need(state.start_skill, "the initial skill"))), _changes(ctx, state),
                                   body)
    result = ctx.optimizer(compose(ctx, state, "prune", memo=True, skill=body, prune_lines=to_json(evidence),
                                   rejected=to_json(rejected), max_lines=cfg.prune_max_lines), reply=PruneReply)
    reply = parse_reply(result.text, PruneReply) if result.ok else None
    status = "ok" if reply is not None else "error" if not result.ok else "unparseable"
    lines = set(rules.content_lines(body))
    for raw in reply.delete if reply is not None else []:
        line = raw if raw in lines else raw.strip()
        if line not in lines or line in rejected:
            continue
        if line in found:
            if rules.OPTIMIZER not in found[line].reasons:
                found[line] = found[line].model_copy(update={"reasons": found[line].reasons + [rules.OPTIMIZER]})
        else:
            found[line] = PruneLine(line=line, reasons=[rules.OPTIMIZER])
    tested = lowest_type_test(ctx, state, base, body) if cfg.prune_blockers else {}
    blocker = _blocker_of(tested)
    if blocker is not None and blocker.part is None and blocker.line not in rejected:  # a whole line: first
        found = {blocker.line: PruneLine(line=blocker.line, reasons=[BLOCKS], of=tested["blocked_type"]),
                 **{k: v for k, v in found.items() if k != blocker.line}}
    picked = [p for p in found.values() if rules.whole_line_first(body, p.line)][: cfg.prune_max_lines]
    common: dict[str, Any] = dict(after_step=after, epoch=epoch, base_skill=base_hash, status=status,
                                  reasoning=(reply.reasoning if reply is not None else result.error or "")[:2000],
                                  call=result.ref, **tested)
    clause = (blocker is not None and blocker.part is not None and blocker.line not in rejected
              and blocker.line not in {p.line for p in picked})
    if not picked and not clause:
        return [PruneProposed(**common)]
    edits = rules.deletion_edits([p.line for p in picked])
    if clause and blocker is not None:  # one clause of a line holds the type down: the rest of the line stays
        edits.append(blocker.edit)
        picked.append(PruneLine(line=blocker.line, reasons=[BLOCKS_CLAUSE], of=tested["blocked_type"]))
    text, report, _ = patch_with(ctx.config, base, edits)
    skill = ctx.put_skill(text)
    return [PruneProposed(skill=skill if skill != base_hash else None, lines=picked, edits=edits, report=report,
                          **common)]


BLOCKS, BLOCKS_CLAUSE = "blocks", "blocks_clause"  # (why a line is proposed: it holds the tested type down)


def lowest_type_test(ctx: RunContext, state: RunState, skill: str, body: str) -> dict[str, Any]:
    """prune_blockers: the current skill's lowest task type on val (its gate score at most STUCK, with two
    failed items or more), each line of the skill removed in turn and rolled out on those items (at most
    blocker_items); PruneProposed's fields, empty when no type is that low."""
    cfg, split = ctx.config, ctx.config.val_split
    current = need(state.current_skill, "the current skill")
    scores = state.score_cache.get(cache_key(split, current))
    key = cache_key(split, current)
    blob = state.results_cache.get(key) or state.slow_results.get(key)
    if scores is None or not blob:
        return {}
    rule = gating.rule_of(cfg)
    results = gating.recorded_results(ctx, state, split, current)
    scored = [(r.item_id, r.task_type or "untyped", item_value(r.hard, r.soft, rule)) for r in
              (results[i["id"]] for i in ctx.env.items(split) if i["id"] in results)]
    low = blocker_rules.low_types(gating.by_type(scores, rule), [(t, v) for _, t, v in scored])
    lines = [ln for ln in dict.fromkeys(rules.content_lines(body)) if rules.whole_line_first(body, ln)]
    if not low or not lines:
        return {}
    ids = blocker_rules.stuck_items(scored, low[0], cfg.blocker_items)
    before = [v for i, _, v in scored if i in set(ids)]
    done = ablate(ctx, state, low[0], lines, ids, before, lambda removals: patch_with(cfg, skill, removals)[0])
    return {"blocked_type": low[0], "type_items": ids, "type_ablations": done.ablations, "type_found": done.chosen}


def _blocker_of(tested: dict[str, Any]) -> LineAblation | None:
    found = tested.get("type_found")
    return tested["type_ablations"][found] if found is not None else None


def decide(ctx: RunContext, state: RunState) -> list[Event]:
    """The step gate on the pruned skill (early reject and the robust rules as configured)."""
    proposal = need(state.prune, "PruneProposed")
    cfg, split = ctx.config, ctx.config.val_split
    current, best = need(state.current_score, "the current score"), need(state.best_score, "the best score")
    common: dict[str, Any] = dict(after_step=proposal.after_step, epoch=proposal.epoch, current_score=current,
                                  best_score=best, rule=cfg.gate_rule)
    if not proposal.skill:
        return [PruneDecided(decision=gate_rules.SKIP, candidate_score=None, reason="nothing to delete", **common)]
    if cfg.early_reject and state.score_cache.get(cache_key(split, proposal.skill)) is None:
        scores, blob, usage, partial = evaluate_early(ctx, state, proposal.skill, split, current)
        if partial is not None:
            event = PruneDecided(decision=gate_rules.REJECT, candidate_score=partial.upper_bound, scores=scores,
                                 results=blob, partial=partial, usage_by_role=usage,
                                 reason=early_reject_reason(partial, current), **common)
            if gating.rule_of(cfg).active:
                early = gating.early_verdict(ctx, state, event, split, current)
                paired, guard = gating.recorded(early.paired, early.guard, cfg, bound=True)
                event = event.model_copy(update={
                    "paired": paired, "type_guard": guard,
                    "reason": gating.early_reason(early, current, partial.scored, partial.of, cfg)})
            return [event]
        maybe_blob: str | None = blob
    else:
        scores, maybe_blob, usage = evaluate_cached(ctx, state, proposal.skill, split)
    score = scores.gate
    if gating.rule_of(cfg).active:
        found = gating.full_verdicts(ctx, state, split, proposal.skill, scores, maybe_blob)
        decision, reason, _ = gating.decision(score, current, best, True, *found, cfg)
        paired, guard = gating.recorded(*found, cfg)
    else:
        decision, reason, _ = gate_decision(score, current, best, True)
        paired = guard = None
    deleted = len(proposal.lines)
    reason = f"{reason}; deletes {deleted} line{'s' if deleted != 1 else ''}"
    return [PruneDecided(decision=decision, candidate_score=score, scores=scores, cached=maybe_blob is None,
                         results=maybe_blob, reason=reason, paired=paired, type_guard=guard, usage_by_role=usage,
                         **common)]
