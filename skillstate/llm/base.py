"""The small client interface every backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from skillstate.events import CallRef
from skillstate.util import hash_value


@dataclass(frozen=True)
class ChatRequest:
    backend: str
    model: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    temperature: float | None
    max_tokens: int

    @classmethod
    def build(cls, backend: str, model: str, messages: list[dict[str, str]], temperature: float | None,
              max_tokens: int) -> "ChatRequest":
        return cls(backend, model, tuple((m["role"], m["content"]) for m in messages), temperature, max_tokens)

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "model": self.model, "messages": self.message_dicts(),
                "temperature": self.temperature, "max_tokens": self.max_tokens}

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
    def from_dict(cls, data: dict[str, Any]) -> "ChatResponse":
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

    @property
    def ok(self) -> bool:
        return self.error is None


class FatalLLMError(Exception):
    """A failure no retry or other request will fix (bad key, unknown model, unreachable endpoint)."""
