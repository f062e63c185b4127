"""Data for weight training from a run's log (skillstate trains no weights).

`grpo_rows` turns an evaluation run with `samples` G > 1 into TRL's
conversational prompt-only rows for GRPOTrainer: the `prompt` (the
messages the target was sent), and per row the G `sampled_completions`,
their `rewards` (the run's gate metric of each) and their group-relative
`advantages` (reward minus the group's mean, over its standard deviation;
zeros for a group whose rewards are all equal). On a multi-turn environment
a group is the G episodes of one task (`exports.episodes`): the prompt is the
episode's first prompt, each sample is the episode's conversation (a list of
messages), each reward the episode's, and `turns` says how long each was.

`sft_rows` turns the successful rollouts of a run's steps into rows of TRL's
conversational language-modeling format (one `messages` column of
`{"role", "content"}` dicts, which SFTTrainer loads as is). The system
message is what the agent was shown: the skill document, or in mode bank
the skills retrieved for that task. Identical conversations are written
once. A successful multi-turn episode gives one row per turn: the exact
prompt of that target call and the action it replied. Tool-calling
conversations are not exported; they are counted as skipped."""

from __future__ import annotations

import json
from typing import Any

from skillstate.bank.advantages import group_advantages
from skillstate.engine.loading import lineage_events, load_run
from skillstate.errors import UserError
from skillstate.exports.episodes import episode_group, is_episode
from skillstate.log.events import RolloutCompleted
from skillstate.log.values import ItemResult
from skillstate.skillopt.gate import gate_score
from skillstate.storage.store import Store
from skillstate.util import canonical_json

ROLES = ("system", "user", "assistant")


def _messages(data: Any) -> list[dict[str, str]] | None:
    """A single-turn conversation as plain messages, or None for any other trajectory."""
    if not isinstance(data, list) or not all(isinstance(m, dict) and m.get("role") in ROLES for m in data):
        return None
    if any(m.get("tool_calls") for m in data):
        return None
    messages = [{"role": m["role"], "content": str(m.get("content") or "")} for m in data]
    if messages and messages[0]["role"] == "system" and not messages[0]["content"].strip():
        messages = messages[1:]  # an empty bank shows no system message
    return messages if messages and messages[-1]["role"] == "assistant" else None


def sft_rows(store: Store, run_id: str) -> tuple[list[dict[str, Any]], int]:
    """(rows, successful trajectories skipped) of the run's step rollouts, fork ancestors included."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    skipped = 0
    for stored in lineage_events(store, run_id):
        event = stored.event
        if not isinstance(event, RolloutCompleted):
            continue
        for result in event.results:
            if result.hard < 1 or not result.trajectory:
                continue
            messages = _messages(json.loads(store.get_blob(result.trajectory)))
            conversations = [messages] if messages is not None else _turns(store, result.calls)
            if not conversations:
                skipped += 1
            for conversation in conversations:
                key = canonical_json(conversation)
                if key not in seen:
                    seen.add(key)
                    rows.append({"messages": conversation})
    return rows, skipped


def _turns(store: Store, calls: list[Any]) -> list[list[dict[str, str]]]:
    """A successful episode as one conversation per turn: the exact prompt of each target call (the skill
    as the system message, the episode so far as the user message) and the action the target replied."""
    out = []
    for ref in calls:
        request, row = store.request_of(ref.request_hash), store.find_call(ref.request_hash)
        if request is None or row is None or row.response is None or request.get("tools"):
            return []  # a tool-calling episode, or a call the journal lacks: not exported
        messages = _messages([*request.get("messages", []),
                              {"role": "assistant", "content": row.response.get("text", "")}])
        if messages is None:
            return []
        out.append(messages)
    return out


def grpo_rows(store: Store, run_id: str) -> tuple[list[dict[str, Any]], int, int]:
    """(rows, groups skipped (tool-calling, or a call the journal lacks), groups left out because a sample's
    call failed) of an evaluation run sampled G > 1 times per item."""
    state = load_run(store, run_id).state
    test = state.tests.get("eval")
    if state.kind != "eval" or test is None or not test.results or int(state.config.get("samples", 1)) < 2:
        raise UserError(f"run {run_id!r} is not an evaluation run with samples: make one with skillstate eval "
                        "--skill FILE --split train --samples 4 --set target.temperature=1.0")
    groups: dict[str, list[ItemResult]] = {}
    for raw in json.loads(store.get_blob(test.results)):
        r = ItemResult.model_validate(raw)
        groups.setdefault(r.item_id, []).append(r)
    metric, weight = state.config.get("gate_metric", "hard"), state.config.get("gate_mixed_weight", 0.5)
    rows, skipped, failed = [], 0, 0
    for item_id, results in groups.items():
        if any(r.fail_reason.startswith("rollout_error") for r in results):
            failed += 1  # a sample the endpoint never answered has no completion to learn from
            continue
        first = json.loads(store.get_blob(results[0].trajectory)) if results[0].trajectory else None
        messages = _messages(first)
        rewards = [gate_score(r.hard, r.soft, metric, weight) for r in results]
        episodes = episode_group(store, results) if messages is None and is_episode(first) else None
        samples: list[Any]  # completions (str), or episode conversations (lists of messages)
        if messages is not None:
            prompt, samples = messages[:-1], [r.prediction for r in results]
        elif episodes is not None:
            prompt, samples = episodes
        else:
            skipped += 1
            continue
        row = {"prompt": prompt, "task_id": item_id, "category": results[0].task_type or None,
               "sampled_completions": samples, "rewards": rewards, "advantages": group_advantages(rewards)}
        rows.append(row if episodes is None else {**row, "turns": [r.turns for r in results]})
    return rows, skipped, failed
