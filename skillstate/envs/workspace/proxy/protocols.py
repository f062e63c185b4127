"""The three APIs agent CLIs speak, read into the run's chat call and written back from its reply.

An agent CLI asks its model through one of: OpenAI chat completions (Qwen Code, OpenCode, programs on
the `openai` client), the OpenAI Responses API (Codex), or Anthropic Messages (Claude Code). The
proxy turns each request into what the run's journaled target call takes (chat messages and function
tools, `Request`), and the call's reply (a `CallResult`: text and tool calls) into that API's answer,
whole or as its server-sent event stream.

What is translated: text, function tools and their calls and results (Codex's free-form tools, such
as `apply_patch`, as a function with one string argument `input`). What is dropped: the client's
sampling settings and model name (the run's target config sets those), images, reasoning items, and
tools a provider runs itself (web search): the run's model is a chat model behind the journal.
Replies carry ids made from the call's request hash, so an answer is a function of the request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from skillstate.llm.base import CallResult, ToolCall

CHAT, RESPONSES, MESSAGES = "chat", "responses", "messages"
CUSTOM_INPUT = "input"  # the one argument of a free-form (custom) tool, as the chat model sees it


class BadRequest(ValueError):
    """A request the proxy cannot read; answered with a 400 in the API's own error shape."""


@dataclass
class Parsed:
    api: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool = False
    model: str = ""
    custom_tools: set[str] = field(default_factory=set)  # Responses API free-form tools, by name
    include_usage: bool = False  # chat completions: stream_options.include_usage


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text of its text parts in order (joined as they are,
    as the APIs read them)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                out.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "tool_result":  # nested in some clients
                out.append(_text(part.get("content")))
        return "".join(out)
    raise BadRequest("a message's content must be text or a list of content parts")


def _function(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise BadRequest("a tool has no name")
    params = parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": name, "description": str(description or ""),
                                             "parameters": params}}


def _arguments(raw: Any) -> str:
    return raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})


def _body(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BadRequest("the request body must be a JSON object")
    return raw


# -- requests ---------------------------------------------------------------------------------------------

def from_chat(raw: Any) -> Parsed:
    body = _body(raw)
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("messages must be a non-empty list")
    messages: list[dict[str, Any]] = []
    for m in body["messages"]:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message must be an object with a role")
        role = "system" if m["role"] == "developer" else m["role"]
        out: dict[str, Any] = {"role": role, "content": _text(m.get("content"))}
        if role == "assistant" and m.get("tool_calls"):
            out["tool_calls"] = [{"id": str(c.get("id", "")), "type": "function",
                                  "function": {"name": str(c.get("function", {}).get("name", "")),
                                               "arguments": _arguments(c.get("function", {}).get("arguments"))}}
                                 for c in m["tool_calls"] if isinstance(c, dict)]
        if role == "tool":
            out["tool_call_id"] = str(m.get("tool_call_id", ""))
        messages.append(out)
    tools = [_function(t["function"].get("name"), t["function"].get("description"), t["function"].get("parameters"))
             for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    options = body.get("stream_options")
    return Parsed(CHAT, messages, tools, bool(body.get("stream")), str(body.get("model", "")),
                  include_usage=isinstance(options, dict) and bool(options.get("include_usage")))


def from_responses(raw: Any) -> Parsed:
    body = _body(raw)
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": _text(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise BadRequest("input must be text or a list of items")
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(str(item.get("role")), str(item.get("role", "user")))
            messages.append({"role": role, "content": _text(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call"):
            args = _arguments(item.get("arguments")) if kind == "function_call" else \
                json.dumps({CUSTOM_INPUT: str(item.get("input", ""))})
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")), "arguments": args}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # one reply: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                             "content": output if isinstance(output, str) else _text(output)})
        # reasoning items, images and a provider's own tool calls are not the chat model's to see
    tools, custom = [], set()
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        if t.get("type") == "function":
            tools.append(_function(t.get("name"), t.get("description"), t.get("parameters")))
        elif t.get("type") == "custom":
            custom.add(str(t.get("name")))
            tools.append(_function(t.get("name"), t.get("description"), {
                "type": "object", "properties": {CUSTOM_INPUT: {"type": "string"}}, "required": [CUSTOM_INPUT]}))
    return Parsed(RESPONSES, messages, tools, bool(body.get("stream")), str(body.get("model", "")), custom)


def from_messages(raw: Any) -> Parsed:
    body = _body(raw)
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BadRequest("messages must be a non-empty list")
    for m in body["messages"]:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise BadRequest("each message must be an object whose role is user, assistant or system")
        blocks = m.get("content")
        if m["role"] == "system":  # Claude Code 2.1 sends its environment as a system message among the others
            messages.append({"role": "system", "content": _text(blocks)})
            continue
        if isinstance(blocks, str):
            messages.append({"role": m["role"], "content": blocks})
            continue
        if not isinstance(blocks, list):
            raise BadRequest("a message's content must be text or a list of blocks")
        text, calls = [], []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind == "tool_use":
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": str(block.get("name", "")),
                                           "arguments": _arguments(block.get("input"))}})
            elif kind == "tool_result":
                content = _text(block.get("content"))
                messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                                 "content": ("error: " + content) if block.get("is_error") else content})
        if m["role"] == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
        elif text:
            messages.append({"role": "user", "content": "".join(text)})
    tools = [_function(t.get("name"), t.get("description"), t.get("input_schema"))
             for t in body.get("tools") or [] if isinstance(t, dict) and "input_schema" in t]
    return Parsed(MESSAGES, messages, tools, bool(body.get("stream")), str(body.get("model", "")))


READERS = {CHAT: from_chat, RESPONSES: from_responses, MESSAGES: from_messages}


# -- replies ----------------------------------------------------------------------------------------------

def _id(result: CallResult, prefix: str, n: int = 0) -> str:
    return f"{prefix}_{result.ref.request_hash[:24]}{'_' + str(n) if n else ''}"


def _usage(result: CallResult) -> tuple[int, int]:
    return result.ref.prompt_tokens, result.ref.completion_tokens


def _input_of(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return (head + "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n").encode()


def chat_reply(result: CallResult, parsed: Parsed) -> dict[str, Any] | list[bytes]:
    pt, ct = _usage(result)
    finish = "tool_calls" if result.tool_calls else "length" if result.truncated else "stop"
    calls = [c.to_message() for c in result.tool_calls]
    usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    base = {"id": _id(result, "chatcmpl"), "created": int(time.time()), "model": parsed.model or "skillstate"}
    if not parsed.stream:
        message: dict[str, Any] = {"role": "assistant", "content": result.text if result.text or not calls else None}
        if calls:
            message["tool_calls"] = calls
        return {**base, "object": "chat.completion", "usage": usage,
                "choices": [{"index": 0, "finish_reason": finish, "message": message}]}
    chunk = {**base, "object": "chat.completion.chunk"}
    out = [sse(None, {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": result.text or ""},
                                            "finish_reason": None}]})]
    for i, call in enumerate(calls):
        out.append(sse(None, {**chunk, "choices": [{"index": 0, "finish_reason": None,
                                                    "delta": {"tool_calls": [{"index": i, **call}]}}]}))
    out.append(sse(None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    if parsed.include_usage:
        out.append(sse(None, {**chunk, "choices": [], "usage": usage}))
    out.append(sse(None, "[DONE]"))
    return out


def responses_reply(result: CallResult, parsed: Parsed) -> dict[str, Any] | list[bytes]:
    pt, ct = _usage(result)
    items: list[dict[str, Any]] = []
    if result.text:
        items.append({"type": "message", "id": _id(result, "msg"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": result.text, "annotations": []}]})
    for n, call in enumerate(result.tool_calls, start=1):
        if call.name in parsed.custom_tools:
            items.append({"type": "custom_tool_call", "id": _id(result, "ctc", n), "call_id": call.id,
                          "name": call.name, "input": str(_input_of(call).get(CUSTOM_INPUT, "")),
                          "status": "completed"})
        else:
            items.append({"type": "function_call", "id": _id(result, "fc", n), "call_id": call.id,
                          "name": call.name, "arguments": call.arguments, "status": "completed"})
    response = {"id": _id(result, "resp"), "object": "response", "created_at": int(time.time()),
                "status": "incomplete" if result.truncated else "completed", "model": parsed.model or "skillstate",
                "output": items, "usage": {"input_tokens": pt, "output_tokens": ct, "total_tokens": pt + ct}}
    if not parsed.stream:
        return response
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": {**response, "status": "in_progress", "output": []}}),
        ("response.in_progress", {"response": {**response, "status": "in_progress", "output": []}})]
    for i, item in enumerate(items):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events += [
                ("response.output_item.added", {"output_index": i, "item": {**item, "status": "in_progress",
                                                                            "content": []}}),
                ("response.content_part.added", {"item_id": item["id"], "output_index": i, "content_index": 0,
                                                 "part": {"type": "output_text", "text": "", "annotations": []}}),
                ("response.output_text.delta", {"item_id": item["id"], "output_index": i, "content_index": 0,
                                                "delta": text}),
                ("response.output_text.done", {"item_id": item["id"], "output_index": i, "content_index": 0,
                                               "text": text}),
                ("response.content_part.done", {"item_id": item["id"], "output_index": i, "content_index": 0,
                                                "part": item["content"][0]})]
        elif item["type"] == "function_call":
            events += [
                ("response.output_item.added", {"output_index": i, "item": {**item, "status": "in_progress",
                                                                            "arguments": ""}}),
                ("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": i,
                                                            "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {"item_id": item["id"], "output_index": i,
                                                           "arguments": item["arguments"]})]
        else:
            events.append(("response.output_item.added", {"output_index": i, "item": item}))
        events.append(("response.output_item.done", {"output_index": i, "item": item}))
    events.append(("response.incomplete" if result.truncated else "response.completed", {"response": response}))
    return [sse(kind, {"type": kind, "sequence_number": n, **data}) for n, (kind, data) in enumerate(events)]


def messages_reply(result: CallResult, parsed: Parsed) -> dict[str, Any] | list[bytes]:
    pt, ct = _usage(result)
    blocks: list[dict[str, Any]] = []
    if result.text:
        blocks.append({"type": "text", "text": result.text})
    for call in result.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input_of(call)})
    stop = "tool_use" if result.tool_calls else "max_tokens" if result.truncated else "end_turn"
    message = {"id": _id(result, "msg"), "type": "message", "role": "assistant", "model": parsed.model or "skillstate",
               "content": blocks, "stop_reason": stop, "stop_sequence": None,
               "usage": {"input_tokens": pt, "output_tokens": ct}}
    if not parsed.stream:
        return message
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": {**message, "content": [], "stop_reason": None,
                                       "usage": {"input_tokens": pt, "output_tokens": 0}}})]
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            events += [("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}),
                       ("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": block["text"]}})]
        else:
            events += [("content_block_start", {"index": i, "content_block": {**block, "input": {}}}),
                       ("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                      "partial_json": json.dumps(block["input"])}})]
        events.append(("content_block_stop", {"index": i}))
    events += [("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": ct}}),
               ("message_stop", {})]
    return [sse(kind, {"type": kind, **data}) for kind, data in events]


WRITERS = {CHAT: chat_reply, RESPONSES: responses_reply, MESSAGES: messages_reply}


def error_body(api: str, message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    if api == MESSAGES:
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind}}
