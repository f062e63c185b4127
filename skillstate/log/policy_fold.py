"""The pure fold of a policy training run's events into its state (called by
`skillstate.log.reducer.reduce`): the steps trained and the last checkpoint,
the validations of the policy, and the bank as evolution left it (current
and best, as a bank run keeps them)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from skillstate.errors import CorruptLogError
from skillstate.log.events_policy import PolicyBankEvolved, PolicyStarted, PolicyTrained, PolicyValidated
from skillstate.log.state import PolicyProgress, RunState, cache_key

PolicyEvent = PolicyStarted | PolicyTrained | PolicyValidated | PolicyBankEvolved


class PolicyFoldError(CorruptLogError, ValueError):
    """A policy event that cannot follow the events before it."""


def reduce_policy(state: RunState, event: PolicyEvent) -> RunState:
    if state.kind != "policy":
        raise PolicyFoldError(f"{event.type} in a {state.kind} run")
    if isinstance(event, PolicyStarted):
        if state.policy is not None:
            raise PolicyFoldError("PolicyStarted twice")
        return replace(state, policy=PolicyProgress(started=event))
    p = state.policy
    if p is None:
        raise PolicyFoldError(f"{event.type} before PolicyStarted")
    if isinstance(event, PolicyTrained):
        if event.step_from != p.step or event.step_to <= event.step_from or event.checkpoint.step != event.step_to:
            raise PolicyFoldError(f"PolicyTrained {event.step_from}->{event.step_to} after step {p.step}")
        return replace(state, policy=replace(p, step=event.step_to, checkpoint=event.checkpoint,
                                             trained=p.trained + (event,)))
    if isinstance(event, PolicyValidated):
        if event.step != p.step or any(v.step == event.step for v in p.validated):
            raise PolicyFoldError(f"PolicyValidated at step {event.step}, after step {p.step}")
        if event.skill != state.current_skill:
            raise PolicyFoldError("PolicyValidated of a bank that is not the current one")
        new = replace(state, policy=replace(p, validated=p.validated + (event,)), current_score=event.scores.gate,
                      score_cache=_with(state.score_cache, cache_key(f"{event.split}@{event.step}", event.skill),
                                        event.scores))
        if state.best_score is None or event.scores.gate > state.best_score:
            new = replace(new, best_skill=event.skill, best_score=event.scores.gate, best_step=event.step)
        return new
    if not p.validated or p.validated[-1].step != event.step or any(e.step == event.step for e in p.evolved):
        raise PolicyFoldError(f"PolicyBankEvolved at step {event.step} without its validation, or twice")
    if event.base_skill != state.current_skill:
        raise PolicyFoldError("PolicyBankEvolved from a bank that is not the current one")
    new = replace(state, policy=replace(p, evolved=p.evolved + (event,)))
    if not event.accepted:
        return new
    if event.candidate is None or event.candidate_score is None:
        raise PolicyFoldError("PolicyBankEvolved accepts no bank")
    new = replace(new, current_skill=event.candidate, current_score=event.candidate_score)
    if state.best_score is None or event.candidate_score > state.best_score:
        new = replace(new, best_skill=event.candidate, best_score=event.candidate_score, best_step=event.step)
    return new


def _with(mapping, key, value):
    out = dict(mapping)
    out[key] = value
    return MappingProxyType(out)
