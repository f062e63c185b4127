"""Whether a tool-using run's target ever called a tool, read from the log.

Small local models often never call a tool, or write the call as text
(`{"name": ..., "arguments": ...}` in the reply's content, which no server
parsed into `tool_calls`). Such a run scores 0 without one failed call, so
its summary and `show` say so. Everything here is derived from the log: the
trajectories the evaluation and rollout events name (each holds the whole
conversation) and, for the replies, the call table.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from skillstate.llm.base import ChatResponse
from skillstate.reading.failures import EventRefs
from skillstate.storage.schema import llm_calls
from skillstate.storage.store import Store

# The function the start-up check asks a tool-using target to call (the sim backend plays a model that calls it).
PROBE_TOOL = "skillstate_ping"

# A reply's text is looked at up to this many characters, from at most this many `{`.
MAX_TEXT, MAX_STARTS = 20_000, 50
CHUNK = 900  # request hashes per IN (...) list, under SQLite's parameter limit


def looks_like_tool_call(text: str) -> bool:
    """A reply whose text holds a JSON object with a name and arguments: a tool call written as text."""
    text = text[:MAX_TEXT]
    decoder = json.JSONDecoder()
    start, tried = text.find("{"), 0
    while start != -1 and tried < MAX_STARTS:
        tried += 1
        try:
            value, _ = decoder.raw_decode(text[start:])
        except (json.JSONDecodeError, RecursionError):
            value = None
        if _is_call(value):
            return True
        start = text.find("{", start + 1)
    return False


def _is_call(value: Any) -> bool:
    if isinstance(value, list):
        return any(_is_call(v) for v in value[:10])
    if not isinstance(value, dict):
        return False
    if isinstance(value.get("function"), dict):
        return _is_call(value["function"])
    return isinstance(value.get("name"), str) and ("arguments" in value or "parameters" in value)


def tool_use(store: Store, env: str, refs: EventRefs, disclosure: bool = False) -> dict[str, int] | None:
    """For a run whose target calls tools (a tool environment's, or the skill
    tools of `disclosure`): of the target replies its events depend on, how
    many there are, the tool calls they made, and how many wrote a tool call
    as text instead. None for other runs."""
    if not disclosure and not _uses_tools(env):
        return None
    hashes = {ref.request_hash for _, called in refs for ref in called if ref.role == "target" and ref.error is None}
    out = {"replies": 0, "tool_calls": 0, "text_tool_calls": 0}
    found: set[str] = set()
    ordered = sorted(hashes)
    with store.engine.connect() as conn:
        for i in range(0, len(ordered), CHUNK):
            query = (select(llm_calls.c.request_hash, llm_calls.c.response)
                     .where(llm_calls.c.request_hash.in_(ordered[i:i + CHUNK]), llm_calls.c.ok.is_(True)))
            for h, raw in conn.execute(query):
                if h in found:  # the first successful reply is the one served; any other is the same request
                    continue
                found.add(h)
                reply = ChatResponse.from_dict(_json(raw))
                out["replies"] += 1
                out["tool_calls"] += len(reply.tool_calls)
                out["text_tool_calls"] += not reply.tool_calls and looks_like_tool_call(reply.text)
    return out


def _json(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _uses_tools(env: str) -> bool:
    if env == "qa":  # the default environment answers in text (its class need not be imported to know it)
        return False
    from skillstate.envs.registry import resolve_env
    from skillstate.envs.tools import ToolEnv

    try:
        return issubclass(resolve_env(env), ToolEnv)
    except Exception:  # a custom environment this process cannot import: nothing to say about it
        return False
