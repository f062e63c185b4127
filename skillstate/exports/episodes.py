"""A multi-turn episode as GRPO data, after SkillRL: a group is the G
episodes sampled for one task, and each episode is one sample scored by its
episode reward. The group's `prompt` is what the target was first sent (the
skill, or the skills retrieved for the task, as the system message; the task
and its starting observation as the user message); a sample is the episode's
conversation from there on: each reply as an assistant turn, each
observation it got back as a user turn."""

from __future__ import annotations

import json
from typing import Any

from skillstate.log.values import ItemResult
from skillstate.storage.store import Store

Message = dict[str, str]


def is_episode(trajectory: Any) -> bool:
    return isinstance(trajectory, dict) and trajectory.get("kind") == "episode"


def episode_prompt(store: Store, result: ItemResult) -> list[Message] | None:
    """The messages of the episode's first target call; None for a tool-calling episode or one whose
    first call the journal lacks."""
    if not result.calls:
        return None
    request = store.request_of(result.calls[0].request_hash)
    if request is None or request.get("tools"):
        return None
    messages = [{"role": str(m.get("role")), "content": str(m.get("content") or "")}
                for m in request.get("messages", [])]
    if messages and messages[0]["role"] == "system" and not messages[0]["content"].strip():
        messages = messages[1:]  # an empty bank shows no system message
    return messages or None


def episode_conversation(trajectory: dict[str, Any]) -> list[Message]:
    """The episode after its first prompt: reply, observation, reply, ..."""
    out: list[Message] = []
    for turn in trajectory.get("turns", []):
        out.append({"role": "assistant", "content": str(turn.get("reply") or turn.get("action") or "")})
        if turn.get("observation") is not None:
            out.append({"role": "user", "content": str(turn["observation"])})
    return out


def episode_group(store: Store, results: list[ItemResult]) -> tuple[list[Message], list[list[Message]]] | None:
    """(prompt, one conversation per sample) of one task's G episodes, or None when one cannot be exported."""
    prompt = episode_prompt(store, results[0])
    if prompt is None:
        return None
    conversations = []
    for r in results:
        trajectory = json.loads(store.get_blob(r.trajectory)) if r.trajectory else None
        if not isinstance(trajectory, dict) or not is_episode(trajectory):
            return None
        conversations.append(episode_conversation(trajectory))
    return prompt, conversations
