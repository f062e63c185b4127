"""How the final selection's events fold into the run's state (called by
`skillstate.log.reducer.reduce`): the candidates' selection scores are kept, and
the pick becomes the run's best skill, the one `export`, `show`, the test
evaluation and the dashboard use."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from skillstate.log.selection_events import FinalSelected, SelectionScored
from skillstate.log.state import RunState, cache_key


def reduce_selection(state: RunState, event: SelectionScored | FinalSelected) -> RunState:
    from skillstate.log.reducer import FoldError  # the reducer imports this module

    if state.progress is not None or state.boundary is not None or state.final_selection is not None:
        raise FoldError(f"{event.type} in the middle of a step, an epoch boundary or after the pick")
    if state.tests.get("best") is not None:
        raise FoldError(f"{event.type} after the best skill's test evaluation")
    if isinstance(event, SelectionScored):
        if event.rank != len(state.selection_scored):
            raise FoldError(f"SelectionScored rank {event.rank} out of order")
        cache = dict(state.score_cache)
        cache[cache_key(event.split, event.skill)] = event.scores
        return replace(state, selection_scored=state.selection_scored + (event,),
                       score_cache=MappingProxyType(cache))
    scored = state.selection_scored
    if not 0 <= event.chosen < len(scored) or scored[event.chosen].skill != event.skill:
        raise FoldError("FinalSelected picks a skill that was not scored on the selection split")
    return replace(state, final_selection=event, best_skill=event.skill, best_score=event.val_score,
                   best_step=event.from_step)
