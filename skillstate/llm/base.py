"""The small client interface every backend implements."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from skillstate.log.events import CallRef
from skillstate.util import canonical_json, hash_value, ordered_json, redact


@dataclass(frozen=True)
class ChatRequest:
    backend: str
    model: str
    # (role, content), or (role, content, canonical JSON of the message's other keys: `tool_calls` of an
    # assistant message, `tool_call_id` and `name` of a tool result)
    messages: tuple[tuple[str, ...], ...]
    temperature: float | None
    max_tokens: int
    # The JSON of the `response_format` and the `tools` list sent, if any, keys in their given order (a schema's
    # property order is the order a constrained server makes the model write the fields in); the hash sorts them.
    response_format: str | None = None
    tools: str | None = None
    # A sample's index among G samples of the same prompt (sent as the API's `seed`): distinct samples are
    # distinct requests, journaled and replayed one by one instead of collapsing into one.
    seed: int | None = None
    extra_body: str | None = None  # the JSON of the role's `extra_body` fields, sent at the body's top level

    @classmethod
    def build(cls, backend: str, model: str, messages: list[dict[str, Any]], temperature: float | None,
              max_tokens: int, response_format: dict[str, Any] | None = None,
              tools: list[dict[str, Any]] | None = None, seed: int | None = None,
              extra_body: dict[str, Any] | None = None) -> ChatRequest:
        fmt = ordered_json(response_format) if response_format is not None else None
        return cls(backend, model, tuple(_message_tuple(m) for m in messages), temperature, max_tokens, fmt,
                   ordered_json(tools) if tools else None, seed, ordered_json(extra_body) if extra_body else None)

    def message_dicts(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in self.messages:
            d: dict[str, Any] = {"role": m[0], "content": m[1]}
            if len(m) > 2:
                d.update(json.loads(m[2]))
            out.append(d)
        return out

    def tool_list(self) -> list[dict[str, Any]]:
        return json.loads(self.tools) if self.tools else []

    def to_dict(self) -> dict[str, Any]:
        out = {"backend": self.backend, "model": self.model, "messages": self.message_dicts(),
               "temperature": self.temperature, "max_tokens": self.max_tokens}
        # absent when unset, so the hashes of requests without them stay what they were
        if self.response_format is not None:
            out["response_format"] = json.loads(self.response_format)
        if self.tools is not None:
            out["tools"] = json.loads(self.tools)
        if self.seed is not None:
            out["seed"] = self.seed
        if self.extra_body is not None:
            out["extra_body"] = json.loads(self.extra_body)
        return out

    @property
    def hash(self) -> str:
        """Of the canonical JSON (keys sorted at every level): the same whatever order a schema's keys are sent
        in, so a request journaled when schemas were sent sorted still hashes the same."""
        return hash_value(self.to_dict())


# The message keys besides role and content that are sent and hashed: those of function calling. Others
# (a `name`, say) were never sent, so leaving them out keeps older requests' hashes what they were.
MESSAGE_EXTRAS = ("tool_calls", "tool_call_id")


def _message_tuple(m: dict[str, Any]) -> tuple[str, ...]:
    extra = {k: m[k] for k in MESSAGE_EXTRAS if m.get(k) is not None}
    content = m.get("content") or ""
    return (m["role"], content, canonical_json(extra)) if extra else (m["role"], content)


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for; `arguments` is the JSON text it wrote."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def to_message(self) -> dict[str, Any]:
        """As it goes back to the model inside the assistant message."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ChatResponse:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "prompt_tokens": self.prompt_tokens,
                               "completion_tokens": self.completion_tokens, "finish_reason": self.finish_reason}
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatResponse:
        calls = tuple(ToolCall(str(c.get("id", "")), str(c.get("name", "")), str(c.get("arguments", "")))
                      for c in data.get("tool_calls") or [] if isinstance(c, dict))
        return cls(data.get("text", ""), data.get("prompt_tokens", 0), data.get("completion_tokens", 0),
                   data.get("finish_reason"), calls)


class LLMClient(Protocol):
    """A backend: turns one chat request into one response or raises."""

    name: str

    def complete(self, request: ChatRequest) -> ChatResponse: ...


@dataclass(frozen=True)
class CallResult:
    """What a stage gets back: the text (or an error) and the call reference."""

    ref: CallRef
    text: str = ""
    error: str | None = None
    cached: bool = field(default=False, compare=False)
    truncated: bool = False  # the reply stopped at max_tokens (finish_reason length)
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


class MaskedError(Exception):
    """An error whose message is stored and shown: the credentials in it are masked when it is made
    (`skillstate.util.redact`: the run's keys, whatever their shape, as an endpoint may quote them)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class FatalLLMError(MaskedError):
    """A failure no retry or other request will fix (bad key, unknown model,
    a server that does not speak the chat completions API): the run stops."""


class CallFailed(MaskedError):
    """One call failed for good: retries ran out (timeout, dropped connection,
    429 or 5xx) or the reply was unusable (malformed body, empty or truncated
    optimizer reply). Its message is what the call table and the events record."""


class CircuitOpen(Exception):
    """Too many calls failed (the circuit breaker): the run stops, resumable."""
