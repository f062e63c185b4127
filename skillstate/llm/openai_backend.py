"""OpenAI-compatible backend on the official `openai` package.

Works with OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp's server and any
server speaking the chat completions API. The failure policy:

- transient errors (408, 409, 429, 5xx, timeouts, dropped connections) are
  retried by the `openai` client itself (`max_retries`, exponential backoff
  honouring Retry-After); when retries run out the call fails (`CallFailed`);
- errors no retry will fix (400, 401, 403, 404, 422, or a reply that is not a
  chat completion at all) stop the run (`FatalLLMError`);
- a malformed reply (empty or truncated body, `choices` of the wrong shape)
  is a failed call, named precisely.
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

import openai
from openai._legacy_response import RAW_RESPONSE_HEADER

from skillstate.config import ModelConfig, redact
from skillstate.errors import UserError
from skillstate.llm.base import CallFailed, ChatRequest, ChatResponse, FatalLLMError, ToolCall
from skillstate.util import first_line, hash_value, register_secret

DEFAULT_AZURE_API_VERSION = "2024-10-21"

# Statuses no retry will fix.
FATAL_STATUS = {400, 401, 403, 404, 422}


def retried(status: int) -> bool:
    """Whether the openai client retries this status (408, 409, 429, 5xx)."""
    return status in (408, 409, 429) or status >= 500


def api_key(cfg: ModelConfig, role: str) -> str:
    """The role's API key, from its environment variable; a UserError when
    it is unset, or when an Azure endpoint has no base_url. The key is
    registered as a secret: `redact` masks it from then on, whatever its shape."""
    key = os.environ.get(cfg.api_key_env)
    register_secret(key)
    if not key:
        raise UserError(
            f"backend openai needs an API key for the {role}: set {cfg.api_key_env} "
            "(any value for a local server without auth)"
        )
    if cfg.azure and not cfg.base_url:
        raise UserError(f"{role}.azure needs {role}.base_url (the Azure endpoint)")
    return key


class OpenAIBackend:
    name = "openai"

    def __init__(self, cfg: ModelConfig, role: str):
        key = api_key(cfg, role)
        self.cfg = cfg
        self.role = role
        self.client: openai.OpenAI
        try:
            if cfg.azure:
                assert cfg.base_url is not None  # (api_key checked it)
                self.client = openai.AzureOpenAI(
                    azure_endpoint=cfg.base_url, api_key=key,
                    api_version=cfg.api_version or DEFAULT_AZURE_API_VERSION, timeout=cfg.timeout,
                    max_retries=cfg.max_retries,
                )
            else:
                self.client = openai.OpenAI(api_key=key, base_url=cfg.base_url, timeout=cfg.timeout,
                                            max_retries=cfg.max_retries)
        except Exception as err:  # the client parses the URL (an unclosed IPv6 bracket, a port that is no number)
            if not isinstance(err, (ValueError, openai.OpenAIError)) and type(err).__name__ != "InvalidURL":
                raise
            where = f"{role}.base_url {redact(str(cfg.base_url))!r}" if cfg.base_url else "$OPENAI_BASE_URL"
            raise UserError(f"{where} is not a usable URL: {first_line(redact(str(err)))}") from None

    @property
    def endpoint(self) -> str:
        return redact(str(self.client.base_url))

    def complete(self, request: ChatRequest) -> ChatResponse:
        kwargs: dict[str, Any] = {"model": request.model, "messages": request.message_dicts(),
                                  self.cfg.max_tokens_param: request.max_tokens}
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.response_format is not None:
            kwargs["response_format"] = json.loads(request.response_format)
        if request.tools is not None:
            kwargs["tools"] = request.tool_list()
        if request.seed is not None:
            kwargs["seed"] = request.seed
        # Posted as `chat.completions.with_raw_response.create(**kwargs)` posts it (the same JSON body, with its
        # fields in the order given here, the same headers, retries and errors), without its per-call pass over
        # the parameters' type hints, which changes nothing in a request made of JSON values and took about 40%
        # of the client's CPU per call (tests/test_openai_backend.py holds the two to the same request).
        options: dict[str, Any] = {"headers": {RAW_RESPONSE_HEADER: "true"}}  # the reply unparsed
        if request.extra_body is not None:
            options["extra_json"] = json.loads(request.extra_body)  # merged into the body by the openai client
        try:
            raw: Any = self.client.post("/chat/completions", body=kwargs, cast_to=object, options=cast(Any, options))
        except openai.APIStatusError as err:
            raise self._status_error(err, request.model) from None
        except openai.APITimeoutError:
            raise CallFailed(self._timeout_message()) from None
        except openai.APIConnectionError as err:
            raise CallFailed(self._connection_message(err)) from None
        return parse_chat_body(raw.http_response.text, raw.headers.get("content-type", ""), self._fatal)

    # -- preflight ----------------------------------------------------------

    def check(self, model: str) -> None:
        """Does the endpoint answer, and does it serve `model`? (`skillstate.llm.endpoint_check`)"""
        from skillstate.llm.endpoint_check import check_endpoint

        check_endpoint(self, model)

    # -- messages -----------------------------------------------------------

    def _fatal(self, what: str) -> FatalLLMError:
        return FatalLLMError(f"the {self.role} endpoint {self.endpoint} {what}")

    def _status_error(self, err: openai.APIStatusError, model: str) -> Exception:
        status = err.status_code
        message = redact(server_message(err))
        if status in FATAL_STATUS:
            hint = {401: " (check the API key)", 403: " (check the API key's permissions)",
                    404: f" (check {self.role}.base_url and the model name {model!r})"}.get(status, "")
            return self._fatal(f"answered HTTP {status}: {message}{hint}")
        retry_after = _retry_after(err)
        if not retried(status):
            return CallFailed(f"HTTP {status} (not retried): {message}")
        if retry_after is not None and retry_after > openai_retry_after_cap():
            return CallFailed(f"HTTP {status} (not retried: Retry-After {retry_after:g} s): {message}")
        return CallFailed(f"HTTP {status} after {_attempts(self.cfg.max_retries + 1)}: {message}")

    def _timeout_message(self, tries: int | None = None) -> str:
        return (f"timed out after {self.cfg.timeout:g} s ({_attempts(tries or self.cfg.max_retries + 1)}); "
                f"a slow server needs a larger {self.role}.timeout")

    def _connection_message(self, err: openai.APIConnectionError, tries: int | None = None,
                            preflight: bool = False) -> str:
        cause = err.__cause__ or err.__context__
        name = type(cause).__name__ if cause is not None else ""
        detail = redact(first_line(cause)) if cause is not None else ""
        if "Connect" in name and "Timeout" not in name:
            what = f"cannot reach the {self.role} endpoint {self.endpoint}"
        elif preflight:
            what = f"the {self.role} endpoint {self.endpoint} dropped the connection"
        else:
            what = "the server closed the connection without a reply"
        return f"{what} ({detail or name or 'connection error'}; {_attempts(tries or self.cfg.max_retries + 1)})"


def _attempts(n: int) -> str:
    return f"{n} attempt{'s' * (n != 1)}"


def _retry_after(err: openai.APIStatusError) -> float | None:
    try:
        return float(err.response.headers.get("retry-after", ""))
    except (ValueError, AttributeError):
        return None


def openai_retry_after_cap() -> float:
    """The longest Retry-After the openai client still waits for (it gives up on longer ones)."""
    from openai import _constants

    return float(getattr(_constants, "MAX_RETRY_AFTER_DELAY", 60))


def server_message(err: openai.APIStatusError) -> str:
    """The server's own words: `error.message` of a JSON body, else the body's first line."""
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return first_line(inner["message"])[:300]
        if isinstance(inner, str) and inner.strip():
            return first_line(inner)[:300]
    try:
        text = err.response.text
    except Exception:  # a streamed or closed body
        text = ""
    return first_line(text)[:300] if text.strip() else first_line(err.message)[:300]


def parse_chat_body(text: str, content_type: str, fatal) -> ChatResponse:
    """A chat completion from a raw 200 body; `fatal(what)` builds the error
    for a body that is not a chat completion at all."""
    stripped = text.strip()
    if not stripped:
        raise CallFailed("malformed reply: empty body")
    if not stripped.startswith(("{", "[")):
        shown = " ".join(stripped.split())[:80]
        raise fatal(f"did not answer with a chat completion ({content_type or 'no content type'}: {shown!r}); "
                    "is base_url the server's OpenAI-compatible /v1 address?")
    try:
        body = json.loads(stripped)
    except json.JSONDecodeError as err:
        raise CallFailed(f"malformed reply: truncated or invalid JSON ({err.msg} at char {err.pos} "
                         f"of {len(stripped)})") from None
    if not isinstance(body, dict) or "choices" not in body:
        keys = ", ".join(sorted(body)[:6]) if isinstance(body, dict) else type(body).__name__
        raise fatal(f"did not answer with a chat completion (no 'choices'; got {keys})")
    choices = body["choices"]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CallFailed(f"malformed reply: 'choices' is {json.dumps(choices)[:60]}, not a list of choices")
    choice = choices[0]
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if message is not None and not isinstance(message, dict) or content is not None and not isinstance(content, str):
        raise CallFailed(f"malformed reply: choices[0].message is {json.dumps(message)[:60]}")
    if message is None:
        raise CallFailed("malformed reply: choices[0] has no 'message'")
    if content is None and not message.get("tool_calls"):  # null content is for a reply of tool calls only
        raise CallFailed(f"malformed reply: choices[0].message has content null and no tool_calls "
                         f"(finish_reason {choice.get('finish_reason')!r})")
    usage = body.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return ChatResponse(
        text=content or "",
        prompt_tokens=_int(usage.get("prompt_tokens")),
        completion_tokens=_int(usage.get("completion_tokens")),
        finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
        tool_calls=_tool_calls(message.get("tool_calls")),
    )


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    """The function calls of a reply message; anything else there is a malformed reply."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CallFailed(f"malformed reply: tool_calls is {json.dumps(raw)[:60]}, not a list")
    calls = []
    for n, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise CallFailed(f"malformed reply: tool_calls[{n}] is {json.dumps(call)[:60]}")
        args = fn.get("arguments")
        arguments = args if isinstance(args, str) else json.dumps(args or {})
        fallback = f"call_{n}_{hash_value([fn['name'], arguments])[:8]}"  # a server that gives no id
        calls.append(ToolCall(id=str(call.get("id") or fallback), name=fn["name"], arguments=arguments))
    return tuple(calls)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and value >= 0 else 0
