"""The small client interface every backend implements."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from skillstate.events import CallRef
from skillstate.util import canonical_json, hash_value


@dataclass(frozen=True)
class ChatRequest:
    backend: str
    model: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    temperature: float | None
    max_tokens: int
    response_format: str | None = None  # canonical JSON of the `response_format` sent, if any

    @classmethod
    def build(cls, backend: str, model: str, messages: list[dict[str, str]], temperature: float | None,
              max_tokens: int, response_format: dict[str, Any] | None = None) -> ChatRequest:
        fmt = canonical_json(response_format) if response_format is not None else None
        return cls(backend, model, tuple((m["role"], m["content"]) for m in messages), temperature, max_tokens, fmt)

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    def to_dict(self) -> dict[str, Any]:
        out = {"backend": self.backend, "model": self.model, "messages": self.message_dicts(),
               "temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.response_format is not None:  # absent otherwise, so older request hashes stay valid
            out["response_format"] = json.loads(self.response_format)
        return out

    @property
    def hash(self) -> str:
        return hash_value(self.to_dict())


@dataclass(frozen=True)
class ChatResponse:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "finish_reason": self.finish_reason}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatResponse:
        return cls(data.get("text", ""), data.get("prompt_tokens", 0), data.get("completion_tokens", 0),
                   data.get("finish_reason"))


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

    @property
    def ok(self) -> bool:
        return self.error is None


class FatalLLMError(Exception):
    """A failure no retry or other request will fix (bad key, unknown model,
    a server that does not speak the chat completions API): the run stops."""


class CallFailed(Exception):
    """One call failed for good: retries ran out (timeout, dropped connection,
    429 or 5xx) or the reply was unusable (malformed body, empty or truncated
    optimizer reply). Its message is what the call table and the events record."""


class CircuitOpen(Exception):
    """Too many calls failed (the circuit breaker): the run stops, resumable."""
