"""The start-up check of an OpenAI-compatible endpoint, before a run exists.

- One GET of the models list, with its own short timeout (`CHECK_TIMEOUT`,
  or the role's `timeout` when that is shorter) and no retry: an endpoint
  that accepts the connection and never answers is refused in seconds, not
  after the 600 s a call may take. A body that is not a models list (an
  HTML page, an empty 200) is refused in one line; JSON without a `data`
  list means the server has no models list, and a probe decides instead.
- One 1-token request, only when the list does not name the model (llama.cpp
  and others serve any name) or there is no list.
- For an environment whose target calls tools: one request with a tool the
  model is asked to call. A server that answers it with an error, or
  without a tool call (it ignores `tools`, or writes the call as text), is
  refused in one line that names the fix (llama.cpp's `--jinja`, say):
  otherwise every call of the run would fail, or no tool would ever run.

Nothing here is journaled: no run exists yet. Every refusal is a
`FatalLLMError`, which the caller turns into one line and exit 2.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import openai

from skillstate.llm.base import CallFailed, ChatRequest, FatalLLMError
from skillstate.reading.tool_use import PROBE_TOOL, looks_like_tool_call

if TYPE_CHECKING:
    from skillstate.llm.openai_backend import OpenAIBackend

CHECK_TIMEOUT = 10.0  # seconds the models list may take (a live server answers it at once)
PROBE_TIMEOUT = 120.0  # seconds a probe's reply may take (a CPU server generating a few tokens)
PROBE_RETRIES = 2  # a probe's retries at most (a server still loading its model answers 503 for a while)

PROBE_TOOLS = [{"type": "function", "function": {
    "name": PROBE_TOOL, "description": "Checks that the connection works. Takes no arguments.",
    "parameters": {"type": "object", "properties": {}}}}]
PROBE_MESSAGES = [{"role": "system", "content": "You are connected to tools. Use them when asked."},
                  {"role": "user", "content": f"Call the function {PROBE_TOOL} now."}]
TOOL_FIX = ("serve the model with tool calling on (llama.cpp: llama-server --jinja; vLLM: "
            "--enable-auto-tool-choice --tool-call-parser NAME; Ollama: a model whose template supports tools)")


def check_endpoint(backend: OpenAIBackend, model: str) -> None:
    """Does the endpoint answer, and does it serve `model`?"""
    listed = models_listed(backend, model)
    if listed is not None and model in listed:
        return
    probe = ChatRequest.build(backend.name, model, [{"role": "user", "content": "ping"}], None, 1,
                              extra_body=backend.cfg.extra_body)  # as the run will call it
    try:
        quick(backend).complete(probe)
    except CallFailed as err:
        raise FatalLLMError(f"the {backend.role} endpoint {backend.endpoint} did not answer a test request: "
                            f"{err}") from None


def models_listed(backend: OpenAIBackend, model: str) -> list[str] | None:
    """The model ids the endpoint lists; None when it has no models list."""
    timeout = min(backend.cfg.timeout, CHECK_TIMEOUT)
    client = backend.client.with_options(max_retries=0, timeout=timeout)
    try:
        raw = client.models.with_raw_response.list()
        text, content_type = raw.http_response.text, raw.headers.get("content-type", "")
    except openai.APIStatusError as err:
        if err.status_code in (401, 403):
            raise backend._status_error(err, model) from None
        return None  # no models list on this server: probe instead
    except openai.APITimeoutError:
        hint = (f"a slow server needs a larger {backend.role}.timeout" if timeout < CHECK_TIMEOUT else
                f"the start-up check waits {CHECK_TIMEOUT:g} s for it; is the server up and done loading?")
        raise backend._fatal(f"did not answer its models list in time (timed out after {timeout:g} s, "
                             f"1 attempt; {hint})") from None
    except openai.APIConnectionError as err:
        raise FatalLLMError(backend._connection_message(err, tries=1, preflight=True)) from None
    stripped = text.strip()
    where = "is base_url the server's OpenAI-compatible /v1 address?"
    if not stripped:
        raise backend._fatal(f"answered its models list (GET models) with an empty body; {where}")
    try:
        body = json.loads(stripped)
    except json.JSONDecodeError:
        shown = " ".join(stripped.split())[:80]
        raise backend._fatal(f"answered its models list (GET models) with "
                             f"{content_type or 'no content type'}: {shown!r}, not JSON; {where}") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None  # JSON, but not a models list: probe instead
    return [str(m.get("id")) for m in data if isinstance(m, dict)]


def check_tools(backend: OpenAIBackend, model: str, env: str, disclosure: bool = False) -> None:
    """Does the endpoint do function calling? One request with a tool the model is asked to call (for a tool
    environment, or for `disclosure: tools`, whose target loads skills through tools)."""
    request = ChatRequest.build(backend.name, model, PROBE_MESSAGES, 0.0, 64, tools=PROBE_TOOLS,
                                extra_body=backend.cfg.extra_body)
    what = f"the {backend.role} endpoint {backend.endpoint} does not do tool calling"
    need = (f"disclosure: tools loads skills through tool calls: {TOOL_FIX}, or use disclosure: inline" if disclosure
            else f"env {env} calls tools: {TOOL_FIX}")
    try:
        reply = quick(backend).complete(request)
    except (CallFailed, FatalLLMError) as err:
        said = str(err).removeprefix(f"the {backend.role} endpoint {backend.endpoint} ")  # named once is enough
        raise FatalLLMError(f"{what} (a request with tools failed: {said}); {need}") from None
    if reply.tool_calls:
        return
    said = " ".join(reply.text.split())[:80]
    how = "wrote a tool call as text" if looks_like_tool_call(reply.text) else "answered without calling it"
    raise FatalLLMError(f"{what} (asked to call a tool, the model {how}: {said!r}); {need}; or, if the model "
                        f"can call tools but did not this time, set target.check_tools=false to run anyway")


def quick(backend: OpenAIBackend) -> OpenAIBackend:
    """The backend with a probe's timeout and retries (its messages name them)."""
    import copy

    cfg = backend.cfg.model_copy(update={"timeout": min(backend.cfg.timeout, PROBE_TIMEOUT),
                                         "max_retries": min(backend.cfg.max_retries, PROBE_RETRIES)})
    out = copy.copy(backend)
    out.cfg = cfg
    out.client = backend.client.with_options(timeout=cfg.timeout, max_retries=cfg.max_retries)
    return out
