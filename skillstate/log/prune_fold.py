"""The pure fold of the pruning events into a run's state (called by
`skillstate.log.reducer.reduce`)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from skillstate.errors import CorruptLogError
from skillstate.log.prune_events import PruneDecided, PruneProposed
from skillstate.log.state import RunState, cache_key
from skillstate.skillopt import gate as gate_rules


class PruneFoldError(CorruptLogError, ValueError):
    """A pruning event that cannot follow the events before it."""


def fold_prune(state: RunState, event: PruneProposed | PruneDecided) -> RunState:
    if state.progress is not None or state.boundary is not None:
        raise PruneFoldError(f"{event.type} in the middle of a step or an epoch boundary")
    if isinstance(event, PruneProposed):
        if state.prune is not None or event.after_step != state.last_completed_step \
                or event.after_step <= state.pruned_step:
            raise PruneFoldError(f"PruneProposed after step {event.after_step} out of order")
        return replace(state, prune=event)
    proposal = state.prune
    if proposal is None or proposal.after_step != event.after_step:
        raise PruneFoldError(f"PruneDecided after step {event.after_step} without its proposal")
    new = replace(state, prune=None, pruned_step=event.after_step)
    if event.scores is not None and event.partial is None and proposal.skill:
        key = cache_key(state.config["val_split"], proposal.skill)
        cache = dict(new.score_cache)
        cache[key] = event.scores
        new = replace(new, score_cache=MappingProxyType(cache))
        if event.results:
            results = dict(new.results_cache)
            results[key] = event.results
            new = replace(new, results_cache=MappingProxyType(results))
    if event.decision not in gate_rules.ACCEPTED:
        tried = tuple((proposal.base_skill, p.line) for p in proposal.lines)
        return replace(new, prune_rejected=new.prune_rejected + tried) if event.decision == gate_rules.REJECT else new
    if not proposal.skill or event.candidate_score is None:
        raise PruneFoldError("PruneDecided accepts without a candidate")
    new = replace(new, current_skill=proposal.skill, current_score=event.candidate_score)
    if event.decision == gate_rules.ACCEPT_BEST:
        new = replace(new, best_skill=proposal.skill, best_score=event.candidate_score, best_step=event.after_step)
    return new
