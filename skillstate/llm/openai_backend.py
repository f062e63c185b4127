"""OpenAI-compatible backend on the official `openai` package.

Works with OpenAI, Azure OpenAI, vLLM, Ollama and any server speaking the
chat completions API. Retries (408/409/429/5xx, connection errors) with
exponential backoff that honours Retry-After are done by the `openai`
client itself (`max_retries`); `timeout` bounds each attempt.
"""

from __future__ import annotations

import os

import openai

from skillstate.config import ModelConfig, redact
from skillstate.errors import UserError
from skillstate.llm.base import ChatRequest, ChatResponse, FatalLLMError

DEFAULT_AZURE_API_VERSION = "2024-10-21"


class OpenAIBackend:
    name = "openai"

    def __init__(self, cfg: ModelConfig, role: str):
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise UserError(
                f"backend openai needs an API key for the {role}: set {cfg.api_key_env} "
                "(any value for a local server without auth)"
            )
        self.cfg = cfg
        self.role = role
        if cfg.azure:
            if not cfg.base_url:
                raise UserError(f"{role}.azure needs {role}.base_url (the Azure endpoint)")
            self.client = openai.AzureOpenAI(
                azure_endpoint=cfg.base_url, api_key=key, api_version=cfg.api_version or DEFAULT_AZURE_API_VERSION,
                timeout=cfg.timeout, max_retries=cfg.max_retries,
            )
        else:
            self.client = openai.OpenAI(api_key=key, base_url=cfg.base_url, timeout=cfg.timeout,
                                        max_retries=cfg.max_retries)

    def complete(self, request: ChatRequest) -> ChatResponse:
        kwargs: dict = {"model": request.model, "messages": request.message_dicts(),
                        self.cfg.max_tokens_param: request.max_tokens}
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        try:
            resp = self.client.chat.completions.create(**kwargs)
        except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as err:
            raise FatalLLMError(f"{self.role} model {request.model!r}: {redact(_short(err))}") from None
        except openai.APIConnectionError as err:
            where = redact(str(self.client.base_url))
            raise FatalLLMError(f"cannot reach the {self.role} endpoint {where}: {redact(_short(err))}") from None
        choice = resp.choices[0] if resp.choices else None
        text = (choice.message.content if choice and choice.message else None) or ""
        usage = resp.usage
        return ChatResponse(
            text=text,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            finish_reason=choice.finish_reason if choice else None,
        )


def _short(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
