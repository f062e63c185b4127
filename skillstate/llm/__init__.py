"""LLM clients: the interface, the OpenAI-compatible client, the recorder."""

from skillstate.llm.base import CallResult, ChatRequest, ChatResponse, LLMClient

__all__ = ["CallResult", "ChatRequest", "ChatResponse", "LLMClient"]
