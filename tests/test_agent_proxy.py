"""The agent proxy (`AgentProxy`): requests in the three APIs agent CLIs speak (OpenAI chat completions, the
OpenAI Responses API, Anthropic Messages), streamed or not, are read into one chat call each, and the call's
reply is written back in the API the client spoke.

The clients are the real ones (`openai`, `anthropic`, and `httpx` for raw bodies and server-sent events),
over real sockets. The model call is a scripted stand-in (`Model`) that answers with the results a test
chooses and keeps what it was given: these tests are about the translation, not the journal behind it.
The request shapes in tests/data/agent_requests/ mirror the structure of what Codex, Qwen Code and Claude
Code send, with short placeholder texts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from skillstate.envs.workspace.proxy.server import AgentProxy

if TYPE_CHECKING:
    import anthropic
from skillstate.llm.base import CallResult, ToolCall
from skillstate.log.values import CallRef

REQUESTS = Path(__file__).resolve().parent / "data" / "agent_requests"
HASH = "0123456789abcdef" * 4
TIMEOUT = 5.0  # seconds: a client that waits longer than this has met a hung proxy

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "weather", "description": "the weather in a city",
                                              "parameters": WEATHER}}
AS_FUNCTION = CHAT_TOOL  # what `complete` is offered, whatever API the tool came in


# -- helpers ----------------------------------------------------------------------------------------------

def reply(text: str = "", *calls: ToolCall, error: str | None = None, truncated: bool = False) -> CallResult:
    """A target call's result, with fixed token counts (7 in, 3 out)."""
    return CallResult(ref=CallRef(request_hash=HASH, role="target", prompt_tokens=7, completion_tokens=3),
                      text=text, error=error, truncated=truncated, tool_calls=calls)


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(call_id, name, json.dumps(arguments))


class Model:
    """The scripted `complete`: answers each call with the next of `results` and records what it was given."""

    def __init__(self, *results: CallResult):
        self.results = list(results)
        self.asked: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult:
        self.asked.append((messages, tools))
        return self.results.pop(0)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages of the last call."""
        return self.asked[-1][0]

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tools of the last call."""
        return self.asked[-1][1]


class Raises:
    """A `complete` that raises, as the run's call does when its budget has run out."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult:
        self.calls += 1
        raise RuntimeError("budget exhausted")


def serve(complete: Callable[..., CallResult], agent: Callable[[AgentProxy], Any]) -> tuple[AgentProxy, Any]:
    """Run `agent(proxy)` as the agent while the proxy answers it; the proxy (closed) and what `agent` returned."""
    with AgentProxy(complete) as proxy:
        out = proxy.run_while(lambda: agent(proxy))
    return proxy, out


def openai_client(proxy: AgentProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=proxy.key, max_retries=0, timeout=TIMEOUT)


def anthropic_client(proxy: AgentProxy) -> anthropic.Anthropic:
    """The Anthropic client adds /v1 itself (imported here: importing it takes seconds, and every test worker
    collects this module)."""
    import anthropic

    return anthropic.Anthropic(base_url=proxy.base_url.removesuffix("/v1"), api_key=proxy.key, max_retries=0,
                               timeout=TIMEOUT)


def post(proxy: AgentProxy, path: str, body: Any = None, content: bytes | None = None) -> httpx.Response:
    """A raw POST to the proxy: `body` as JSON, or `content` as it is."""
    url = proxy.base_url.removesuffix("/v1") + path
    if content is not None:
        return httpx.post(url, content=content, headers={"Content-Type": "application/json", **auth(proxy)},
                          timeout=TIMEOUT)
    return httpx.post(url, json=body, headers=auth(proxy), timeout=TIMEOUT)


def auth(proxy: AgentProxy) -> dict[str, str]:
    """The rollout's key, as an agent sends it."""
    return {"Authorization": f"Bearer {proxy.key}"}


def sse(text: str) -> list[tuple[str | None, Any]]:
    """Server-sent events as (event name or None, data as JSON, or the raw text where it is not JSON)."""
    events: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
        raw = "\n".join(data)
        try:
            events.append((name, json.loads(raw)))
        except ValueError:
            events.append((name, raw))
    return events


def request(name: str) -> dict[str, Any]:
    """A recorded request shape from tests/data/agent_requests/."""
    return json.loads((REQUESTS / name).read_text())


def collapse(names: list[str]) -> list[str]:
    """The names with runs of the same name made one: the order of kinds of events, whatever their count."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


# -- OpenAI chat completions ------------------------------------------------------------------------------

def test_chat_text_reply_is_a_chat_completion():
    """A plain request is one call with the user's message and no tools; the reply is the call's text, with
    finish_reason stop and the call's token counts. The proxy keeps the call, the exchange and the conversation."""
    model = Model(reply("hello"))
    proxy, out = serve(model, lambda p: openai_client(p).chat.completions.create(
        model="any", messages=[{"role": "user", "content": "hi"}]))
    assert model.asked == [([{"role": "user", "content": "hi"}], None)]
    choice = out.choices[0]
    assert choice.message.content == "hello" and choice.message.role == "assistant"
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (7, 3, 10)
    assert out.id.startswith("chatcmpl_") and HASH[:24] in out.id  # made from the request hash
    assert proxy.calls == [reply("hello")] and proxy.failure is None and proxy.raised is None
    assert proxy.exchanges == [{"api": "chat", "stream": False, "messages": 1, "tools": 0, "text": "hello",
                                "tool_calls": [], "error": None}]
    assert proxy.conversation == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_chat_tool_call_reply_keeps_id_name_and_arguments():
    """Function tools reach the call as they were sent; the call's tool calls come back with their ids, names
    and argument JSON intact, no content, and finish_reason tool_calls."""
    calls = (call("call_a", "weather", city="Oslo"), call("call_b", "weather", city="Lima"))
    model = Model(reply("", *calls))
    proxy, out = serve(model, lambda p: openai_client(p).chat.completions.create(
        model="any", messages=[{"role": "user", "content": "weather?"}], tools=[CHAT_TOOL]))
    assert model.tools == [AS_FUNCTION]
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    got = [(c.id, c.type, c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert got == [(c.id, "function", c.name, c.arguments) for c in calls]
    assert proxy.exchanges[0]["tool_calls"] == [c.to_dict() for c in calls]
    assert proxy.conversation[-1] == {"role": "assistant", "content": "",
                                      "tool_calls": [c.to_message() for c in calls]}


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_reassembles_text_and_tool_calls(include_usage):
    """Streamed, the chunks put back together give the call's text and tool calls; a usage chunk (with no
    choices) comes last only when stream_options asks for it."""
    calls = (call("call_a", "weather", city="Oslo"), call("call_b", "weather", city="Lima"))
    model = Model(reply("let me look", *calls))
    options = {"stream_options": {"include_usage": True}} if include_usage else {}

    def agent(p: AgentProxy) -> list[Any]:
        return list(openai_client(p).chat.completions.create(
            model="any", messages=[{"role": "user", "content": "weather?"}], tools=[CHAT_TOOL], stream=True,
            **options))

    proxy, chunks = serve(model, agent)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assembled: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            slot = assembled.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += delta.id or ""
            slot["name"] += delta.function.name or ""
            slot["arguments"] += delta.function.arguments or ""
    assert text == "let me look"
    assert [assembled[i] for i in sorted(assembled)] == [c.to_dict() for c in calls]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    usage = [c.usage for c in chunks if c.usage is not None]
    if include_usage:
        assert chunks[-1].choices == [] and len(usage) == 1
        assert (usage[0].prompt_tokens, usage[0].completion_tokens, usage[0].total_tokens) == (7, 3, 10)
    else:
        assert usage == []
    assert proxy.exchanges[0]["stream"] is True


def test_chat_second_turn_arrives_as_chat_messages_with_tool_call_id():
    """A follow-up carrying the assistant's tool calls and the tool's result reaches the call as chat messages:
    the assistant message with its tool calls (content None read as ""), then a tool message with its id."""
    model = Model(reply("sunny"))
    turn = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_a", "type": "function",
                             "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 20C"}]
    _, out = serve(model, lambda p: openai_client(p).chat.completions.create(
        model="any", messages=turn, tools=[CHAT_TOOL]))
    assert out.choices[0].message.content == "sunny"
    assert model.messages == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_a", "type": "function",
                         "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "sunny, 20C", "tool_call_id": "call_a"}]


def test_chat_content_parts_are_joined_and_developer_becomes_system():
    """Content given as a list of text parts arrives as their text joined; a developer message as a system one."""
    model = Model(reply("ok"))
    serve(model, lambda p: openai_client(p).chat.completions.create(model="any", messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]))
    assert model.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]


# -- OpenAI Responses API ---------------------------------------------------------------------------------

RESPONSES_TOOL = {"type": "function", "name": "weather", "description": "the weather in a city",
                  "parameters": WEATHER}


def test_responses_reply_has_a_message_and_function_calls():
    """Not streamed: the reply's output is a message with the text as output_text, then one function_call
    item per tool call with its call_id, name and arguments; status completed, usage in input/output tokens."""
    model = Model(reply("checking", call("call_a", "weather", city="Oslo")))
    _, out = serve(model, lambda p: openai_client(p).responses.create(
        model="any", input="weather?", tools=[RESPONSES_TOOL]))
    assert model.asked == [([{"role": "user", "content": "weather?"}], [AS_FUNCTION])]
    assert out.status == "completed" and out.output_text == "checking"
    message, function_call = out.output
    assert message.type == "message" and message.role == "assistant"
    assert [(c.type, c.text) for c in message.content] == [("output_text", "checking")]
    assert (function_call.type, function_call.call_id, function_call.name, function_call.arguments) == \
        ("function_call", "call_a", "weather", '{"city": "Oslo"}')
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (7, 3, 10)


def test_responses_stream_ends_with_the_completed_response():
    """Streamed: the events, in order, have increasing sequence numbers; the text comes as a delta, the function
    call's arguments likewise, each output item is done before response.completed, which carries them all."""
    calls = (call("call_a", "weather", city="Oslo"), call("call_b", "weather", city="Lima"))
    model = Model(reply("checking", *calls))
    _, events = serve(model, lambda p: list(openai_client(p).responses.create(
        model="any", input="weather?", tools=[RESPONSES_TOOL], stream=True)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "checking"
    arguments = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert arguments == [c.arguments for c in calls]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["message", "function_call", "function_call"]
    completed = events[-1].response
    assert completed.status == "completed" and completed.output_text == "checking"
    assert [(i.call_id, i.name, i.arguments) for i in completed.output[1:]] == \
        [(c.id, c.name, c.arguments) for c in calls]


def test_responses_input_items_become_chat_messages():
    """`instructions` becomes the system message, a developer message a system one, a function_call item an
    assistant message with tool calls (two in a row share one), and function_call_output a tool message."""
    model = Model(reply("done"))
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
             {"type": "function_call", "call_id": "call_a", "name": "weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call", "call_id": "call_b", "name": "weather", "arguments": '{"city": "Lima"}'},
             {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
             {"type": "function_call_output", "call_id": "call_b", "output": "rain"}]
    serve(model, lambda p: openai_client(p).responses.create(
        model="any", instructions="be brief", input=items, tools=[RESPONSES_TOOL]))
    assert model.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_a", "type": "function",
                         "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
                        {"id": "call_b", "type": "function",
                         "function": {"name": "weather", "arguments": '{"city": "Lima"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"}]


APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "apply a patch"}
APPLY_PATCH_FUNCTION = {"type": "function", "function": {
    "name": "apply_patch", "description": "apply a patch",
    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_responses_custom_tool_is_a_function_of_one_string(stream):
    """A free-form (custom) tool is offered to the call as a function with one string parameter `input`; the
    call's `{"input": ...}` comes back as a custom_tool_call item whose `input` is that string (read as raw
    JSON, streamed or not)."""
    model = Model(reply("", call("call_p", "apply_patch", input="PATCH")))
    body = {"model": "any", "input": "fix it", "tools": [APPLY_PATCH], "stream": stream}
    _, response = serve(model, lambda p: post(p, "/v1/responses", body))
    assert response.status_code == 200
    assert model.tools == [APPLY_PATCH_FUNCTION]
    if stream:
        events = sse(response.text)
        done = [data["item"] for name, data in events if name == "response.output_item.done"]
        output = events[-1][1]["response"]["output"]
        assert done == output
    else:
        output = response.json()["output"]
    assert len(output) == 1
    assert {k: output[0][k] for k in ("type", "call_id", "name", "input")} == \
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "PATCH"}


def test_responses_custom_tool_call_in_input_is_a_call_with_input_argument():
    """A custom_tool_call the agent sends back (and its output) reach the call as a function call whose
    arguments are `{"input": <the free-form text>}` and a tool message."""
    model = Model(reply("applied"))
    items = [{"type": "message", "role": "user", "content": "fix it"},
             {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "PATCH"},
             {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done"}]
    serve(model, lambda p: post(p, "/v1/responses", {"model": "any", "input": items, "tools": [APPLY_PATCH]}))
    assert model.messages[1:] == [
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call_p", "type": "function",
                         "function": {"name": "apply_patch", "arguments": json.dumps({"input": "PATCH"})}}]},
        {"role": "tool", "tool_call_id": "call_p", "content": "Done"}]


# -- Anthropic Messages -----------------------------------------------------------------------------------

ANTHROPIC_TOOL = {"name": "weather", "description": "the weather in a city", "input_schema": WEATHER}


def test_messages_text_reply_with_system_blocks_as_one_system_message():
    """A `system` given as text blocks becomes one system message (their text joined); the reply is one text
    block with stop_reason end_turn and the call's token counts."""
    model = Model(reply("hello"))
    _, out = serve(model, lambda p: anthropic_client(p).messages.create(
        model="any", max_tokens=100, messages=[{"role": "user", "content": "hi"}],
        system=[{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]))
    assert model.asked == [([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], None)]
    assert [(b.type, b.text) for b in out.content] == [("text", "hello")]
    assert out.role == "assistant" and out.stop_reason == "end_turn"
    assert (out.usage.input_tokens, out.usage.output_tokens) == (7, 3)


def test_messages_tool_use_reply_has_id_name_and_input():
    """Tools with input_schema become function tools; the call's tool calls come back as tool_use blocks with
    their id, name and arguments as an input dict, after the text, and stop_reason tool_use."""
    calls = (call("toolu_a", "weather", city="Oslo"), call("toolu_b", "weather", city="Lima"))
    model = Model(reply("checking", *calls))
    _, out = serve(model, lambda p: anthropic_client(p).messages.create(
        model="any", max_tokens=100, messages=[{"role": "user", "content": "weather?"}], tools=[ANTHROPIC_TOOL]))
    assert model.tools == [AS_FUNCTION]
    assert out.stop_reason == "tool_use"
    assert [b.type for b in out.content] == ["text", "tool_use", "tool_use"]
    assert [(b.id, b.name, b.input) for b in out.content[1:]] == \
        [("toolu_a", "weather", {"city": "Oslo"}), ("toolu_b", "weather", {"city": "Lima"})]


def test_messages_stream_gives_the_same_final_message():
    """Streamed through the client's stream helper, the final message holds the text and the tool use, with
    the input rebuilt from its JSON delta, and the stop reason."""
    model = Model(reply("checking", call("toolu_a", "weather", city="Oslo")))

    def agent(p: AgentProxy) -> Any:
        with anthropic_client(p).messages.stream(model="any", max_tokens=100, tools=[ANTHROPIC_TOOL],
                                                 messages=[{"role": "user", "content": "weather?"}]) as stream:
            text = "".join(stream.text_stream)
            return text, stream.get_final_message()

    proxy, (text, final) = serve(model, agent)
    assert text == "checking"
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 3
    assert final.content[0].type == "text" and final.content[0].text == "checking"
    assert (final.content[1].type, final.content[1].id, final.content[1].name, final.content[1].input) == \
        ("tool_use", "toolu_a", "weather", {"city": "Oslo"})
    assert proxy.exchanges[0]["api"] == "messages" and proxy.exchanges[0]["stream"] is True


def test_messages_second_turn_arrives_as_tool_calls_and_tool_messages():
    """A follow-up with tool_use blocks and their tool_result blocks reaches the call as an assistant message
    with tool calls (input as argument JSON) and one tool message per result; an is_error result's content
    starts with "error: ", and text after the results is a user message."""
    model = Model(reply("sunny there, no idea here"))
    turn = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "toolu_b", "name": "weather", "input": {"city": "Nowhere"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "no such city", "is_error": True},
                {"type": "text", "text": "go on"}]}]
    serve(model, lambda p: anthropic_client(p).messages.create(
        model="any", max_tokens=100, messages=turn, tools=[ANTHROPIC_TOOL]))
    assert model.messages == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "checking",
         "tool_calls": [{"id": "toolu_a", "type": "function",
                         "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})}},
                        {"id": "toolu_b", "type": "function",
                         "function": {"name": "weather", "arguments": json.dumps({"city": "Nowhere"})}}]},
        {"role": "tool", "tool_call_id": "toolu_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_b", "content": "error: no such city"},
        {"role": "user", "content": "go on"}]


def test_messages_count_tokens_is_answered_without_a_call():
    """Counting tokens (which Claude Code asks for) gets an estimate and makes no model call."""
    model = Model()
    proxy, out = serve(model, lambda p: anthropic_client(p).messages.count_tokens(
        model="any", messages=[{"role": "user", "content": "one two three"}]))
    assert out.input_tokens > 0 and model.asked == [] and proxy.calls == []


# -- a reply read back -----------------------------------------------------------------------------------

USER = "weather?"
LOOKED_UP = call("call_a", "weather", city="Oslo")


def chat_agent(p: AgentProxy) -> None:
    """Two turns as an agent on the OpenAI client makes them: the reply goes back as it came, with a result."""
    client, user = openai_client(p), {"role": "user", "content": USER}
    first = client.chat.completions.create(model="any", messages=[user], tools=[CHAT_TOOL]).choices[0].message
    client.chat.completions.create(model="any", tools=[CHAT_TOOL], messages=[
        user, first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny"}])


def responses_agent(p: AgentProxy) -> None:
    """Two turns as Codex makes them: the reply's output items go back as input, then the call's output."""
    client, user = openai_client(p), {"type": "message", "role": "user", "content": USER}
    first = client.responses.create(model="any", input=[user], tools=[RESPONSES_TOOL])
    back = [item.model_dump(exclude_none=True) for item in first.output]
    client.responses.create(model="any", tools=[RESPONSES_TOOL], input=[
        user, *back, {"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "sunny"}])


def messages_agent(p: AgentProxy) -> None:
    """Two turns as Claude Code makes them: the reply's content blocks go back, then a tool_result."""
    client, user = anthropic_client(p), {"role": "user", "content": USER}
    first = client.messages.create(model="any", max_tokens=100, messages=[user], tools=[ANTHROPIC_TOOL])
    client.messages.create(model="any", max_tokens=100, tools=[ANTHROPIC_TOOL], messages=[
        user, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[-1].id,
                                      "content": "sunny"}]}])


@pytest.mark.parametrize("agent", [
    chat_agent,
    responses_agent,
    messages_agent,
], ids=["chat", "responses", "messages"])
def test_a_reply_sent_back_is_the_conversation_so_far(agent):
    """A reply with text and a tool call, sent back by the agent with the tool's result, reaches the next call
    as the first call's messages, the reply as one assistant message (text and tool call), and a tool message:
    what the model said is what it is shown."""
    model = Model(reply("checking", LOOKED_UP), reply("sunny in Oslo"))
    proxy, _ = serve(model, agent)
    said = {"role": "assistant", "content": "checking", "tool_calls": [LOOKED_UP.to_message()]}
    assert model.asked[1][0] == [*model.asked[0][0], said, {"role": "tool", "tool_call_id": "call_a",
                                                            "content": "sunny"}]
    assert proxy.conversation[-1] == {"role": "assistant", "content": "sunny in Oslo"}


# -- replies cut at max_tokens ----------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "body", "stop"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
     lambda r: r["choices"][0]["finish_reason"] == "length"),
    ("/v1/responses", {"input": "hi"}, lambda r: r["status"] == "incomplete"),
    ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
     lambda r: r["stop_reason"] == "max_tokens"),
], ids=["chat", "responses", "messages"])
def test_a_truncated_reply_says_so_in_each_api(path, body, stop):
    """A call cut at max_tokens is answered with each API's own way of saying so."""
    _, response = serve(Model(reply("partial", truncated=True)), lambda p: post(p, path, body))
    assert response.status_code == 200 and stop(response.json())


# -- real request shapes, streamed ------------------------------------------------------------------------

def test_codex_responses_request_streams_a_completed_response():
    """Codex's request: the developer message and user messages become chat messages, the reasoning item is
    left out, the function call and its output become a tool call and a tool message; only the function tools
    are offered (the namespace and web_search entries are dropped). The stream is named events, in order,
    with increasing sequence numbers, the output items done before response.completed."""
    body = request("codex_responses.json")
    model = Model(reply("two files", call("call_0002", "shell", command=["cat", "a.txt"])))
    _, response = serve(model, lambda p: post(p, "/v1/responses", body))
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"

    assert [m["role"] for m in model.messages] == ["system", "system", "user", "user", "assistant", "tool"]
    assert model.messages[1]["content"] == "Placeholder sandbox and approval notes."
    assert model.messages[4]["tool_calls"] == [{"id": "call_0001", "type": "function", "function": {
        "name": "shell", "arguments": body["input"][4]["arguments"]}}]
    assert model.messages[5] == {"role": "tool", "tool_call_id": "call_0001", "content": "a.txt\nb.txt"}
    assert "reasoning" not in json.dumps(model.messages)
    assert [t["function"]["name"] for t in model.tools] == ["shell", "update_plan"]
    assert model.tools[0]["function"]["parameters"] == body["tools"][0]["parameters"]

    events = sse(response.text)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert collapse(names) == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    completed = events[-1][1]["response"]
    assert completed["status"] == "completed" and completed["model"] == "gpt-5-codex"
    assert [i["type"] for i in completed["output"]] == ["message", "function_call"]
    assert completed["output"][1]["arguments"] == json.dumps({"command": ["cat", "a.txt"]})


def test_qwen_chat_request_streams_chunks_then_usage_then_done():
    """Qwen Code's request: the system content's text parts are joined, the function tools offered as they
    are. The stream is data-only chunks: the text, the tool call, the finish reason, then a usage chunk with
    no choices, and `data: [DONE]` last."""
    body = request("qwen_chat.json")
    model = Model(reply("reading", call("call_q", "read_file", absolute_path="/w/a.txt")))
    _, response = serve(model, lambda p: post(p, "/v1/chat/completions", body))
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"

    assert model.messages == [
        {"role": "system", "content": "Placeholder system prompt, second part."},
        {"role": "user", "content": "Placeholder context."},
        {"role": "assistant", "content": "Got it."},
        {"role": "user", "content": "Read a.txt."}]
    assert model.tools == body["tools"]

    assert response.text.endswith("data: [DONE]\n\n")
    events = sse(response.text)
    assert all(name is None for name, _ in events)
    *chunks, usage, done = [data for _, data in events]
    assert done == "[DONE]"
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                                         "total_tokens": 10}
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "reading"
    tool_calls = [t for d in deltas for t in d.get("tool_calls", [])]
    assert [(t["index"], t["id"], t["function"]["name"], t["function"]["arguments"]) for t in tool_calls] == \
        [(0, "call_q", "read_file", json.dumps({"absolute_path": "/w/a.txt"}))]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_claude_messages_request_streams_events_in_order():
    """Claude Code's request: the cached system blocks become one system message, the content blocks chat
    messages and a tool call and result, the input_schema tools function tools. The stream is named events:
    message_start, each block's start, delta and stop, message_delta with the stop reason, message_stop."""
    body = request("claude_messages.json")
    model = Model(reply("3 lines", call("toolu_0002", "Read", file_path="/w/a.txt")))
    _, response = serve(model, lambda p: post(p, "/v1/messages?beta=true", body))
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"

    assert model.messages == [
        {"role": "system", "content": "Placeholder identity line. Placeholder instructions."},
        {"role": "user", "content": "Placeholder reminder. Count the lines of a.txt."},
        {"role": "assistant", "content": "Reading it.",
         "tool_calls": [{"id": "toolu_0001", "type": "function", "function": {
             "name": "Bash", "arguments": json.dumps({"command": "wc -l a.txt", "description": "Count lines"})}}]},
        {"role": "tool", "tool_call_id": "toolu_0001", "content": "3 a.txt"}]
    assert [t["function"]["name"] for t in model.tools] == ["Bash", "Read"]
    assert model.tools[0]["function"]["parameters"] == body["tools"][0]["input_schema"]

    events = sse(response.text)
    assert all(name == data["type"] for name, data in events)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["model"] == "claude-sonnet-4-5" and start["content"] == [] and start["stop_reason"] is None
    assert events[1][1]["content_block"] == {"type": "text", "text": ""}
    assert events[2][1]["delta"] == {"type": "text_delta", "text": "3 lines"}
    assert events[4][1]["content_block"] == {"type": "tool_use", "id": "toolu_0002", "name": "Read", "input": {}}
    assert events[5][1]["delta"] == {"type": "input_json_delta", "partial_json": json.dumps({"file_path": "/w/a.txt"})}
    assert [data["index"] for _, data in events[1:7]] == [0, 0, 0, 1, 1, 1]
    assert events[7][1]["delta"]["stop_reason"] == "tool_use" and events[7][1]["usage"] == {"output_tokens": 3}


# -- errors -----------------------------------------------------------------------------------------------

API_PATHS = [("/v1/chat/completions", False), ("/v1/responses", False), ("/v1/messages", True)]
API_IDS = ["chat", "responses", "messages"]


def error_shape(body: dict[str, Any], anthropic_shape: bool) -> dict[str, Any]:
    """The error object inside an answer, checking the envelope is the API's: Anthropic's
    `{"type": "error", "error": {...}}`, OpenAI's `{"error": {...}}`."""
    if anthropic_shape:
        assert body["type"] == "error"
    else:
        assert set(body) == {"error"}
    assert isinstance(body["error"]["message"], str) and body["error"]["type"]
    return body["error"]


@pytest.mark.parametrize(("path", "anthropic_shape"), API_PATHS, ids=API_IDS)
def test_a_body_that_is_not_json_is_a_400(path, anthropic_shape):
    """A body that does not parse is answered 400 in the API's error shape, and no call is made."""
    model = Model()
    _, response = serve(model, lambda p: post(p, path, content=b"{not json"))
    assert response.status_code == 400 and model.asked == []
    assert "not JSON" in error_shape(response.json(), anthropic_shape)["message"]


@pytest.mark.parametrize(("path", "anthropic_shape"), API_PATHS, ids=API_IDS)
def test_a_request_without_messages_is_a_400(path, anthropic_shape):
    """A request without its messages (`input` for the Responses API) is answered 400 with an
    invalid_request_error in the API's error shape, and no call is made."""
    model = Model()
    _, response = serve(model, lambda p: post(p, path, {"model": "any", "max_tokens": 5}))
    assert response.status_code == 400 and model.asked == []
    assert error_shape(response.json(), anthropic_shape)["type"] == "invalid_request_error"


def test_a_missing_anthropic_field_reaches_the_client_as_its_error():
    """Through the Anthropic client, the 400 is a BadRequestError whose body is Anthropic's error envelope."""
    model = Model()

    import anthropic

    def agent(p: AgentProxy) -> anthropic.BadRequestError:
        with pytest.raises(anthropic.BadRequestError) as err:
            anthropic_client(p).messages.create(model="any", max_tokens=5, messages=[])
        return err.value

    _, err = serve(model, agent)
    assert err.status_code == 400 and err.body["type"] == "error"
    assert err.body["error"]["type"] == "invalid_request_error"


def test_an_unknown_path_is_a_404():
    """A POST or GET to a path the proxy does not serve is a 404, and no call is made."""
    model = Model()

    def agent(p: AgentProxy) -> tuple[int, int]:
        root = p.base_url.removesuffix("/v1")
        return (httpx.post(root + "/v1/embeddings", json={"input": "x"}, headers=auth(p), timeout=TIMEOUT).status_code,
                httpx.get(root + "/v1/nothing", headers=auth(p), timeout=TIMEOUT).status_code)

    _, codes = serve(model, agent)
    assert codes == (404, 404) and model.asked == []


def test_models_lists_a_model():
    """GET /v1/models lists one model, which the OpenAI client can read."""
    _, models = serve(Model(), lambda p: list(openai_client(p).models.list()))
    assert [m.id for m in models] == ["skillstate"]


def test_a_failed_call_is_a_400_and_marks_the_failure():
    """A call that failed is answered 400 in the client's API (a BadRequestError through the client, streamed
    or not), the first failure is kept, and every failed call is still recorded."""
    model = Model(reply(error="HTTP 500 from the endpoint"), reply(error="a later failure"))

    def agent(p: AgentProxy) -> list[openai.BadRequestError]:
        errors = []
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as err:
                openai_client(p).chat.completions.create(
                    model="any", messages=[{"role": "user", "content": "hi"}], stream=stream)
            errors.append(err.value)
        return errors

    proxy, errors = serve(model, agent)
    assert [e.status_code for e in errors] == [400, 400]
    assert "HTTP 500 from the endpoint" in errors[0].body["message"] and errors[0].body["type"] == "api_error"
    assert proxy.failure == "HTTP 500 from the endpoint"
    assert [e["error"] for e in proxy.exchanges] == ["HTTP 500 from the endpoint", "a later failure"]
    assert len(proxy.calls) == 2 and proxy.raised is None


def test_a_failed_call_in_the_messages_api_is_an_anthropic_error():
    """Through Anthropic Messages, a failed call's 400 has Anthropic's error envelope."""
    model = Model(reply(error="boom"))
    proxy, response = serve(model, lambda p: post(
        p, "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
    assert response.status_code == 400
    assert error_shape(response.json(), True) == {"type": "api_error", "message": "the model call failed: boom"}
    assert proxy.failure == "boom"


def test_a_call_that_raises_is_kept_and_answered_400_and_the_proxy_still_closes():
    """An exception from the call is kept in `raised` (not raised in the agent's face), the request is answered
    400, later requests are refused without a call, and the proxy shuts down: its server thread ends."""
    complete = Raises()

    def agent(p: AgentProxy) -> list[httpx.Response]:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        return [post(p, "/v1/chat/completions", body), post(p, "/v1/chat/completions", body)]

    proxy, responses = serve(complete, agent)
    assert isinstance(proxy.raised, RuntimeError) and str(proxy.raised) == "budget exhausted"
    assert [r.status_code for r in responses] == [400, 400]
    assert all(r.json()["error"]["type"] == "api_error" for r in responses)
    assert complete.calls == 1 and proxy.calls == []
    assert not proxy._thread.is_alive()


def test_the_agent_failing_is_raised_from_run_while_and_the_proxy_still_closes():
    """An exception in the agent itself comes out of run_while, and the proxy still shuts down."""
    def agent(p: AgentProxy) -> None:
        raise ValueError("the agent crashed")

    with pytest.raises(ValueError, match="the agent crashed"):
        serve(Model(), agent)


def test_a_request_after_the_agent_stopped_is_refused():
    """Once run_while has returned nobody answers calls: a late request is a 400 and makes no call."""
    model = Model(reply("too late"))
    with AgentProxy(model) as proxy:
        proxy.run_while(lambda: None)
        response = post(proxy, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400 and "over" in response.json()["error"]["message"]
    assert model.asked == [] and proxy.calls == []


def test_a_malformed_request_is_a_400_not_a_crash():
    """A request whose fields have the wrong types (tools a number) is answered 400 like any other bad request;
    it does not stop the rollout."""
    model = Model(reply("never"))

    def agent(p: AgentProxy) -> int:
        try:
            return post(p, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], "tools": 5}).status_code
        except httpx.TimeoutException:
            return -1

    _, code = serve(model, agent)
    assert code == 400 and model.asked == []


def test_a_request_without_the_rollouts_key_is_refused():
    """Only the rollout's agent holds its key: another local process gets a 401, and no call is made."""
    model = Model(reply("never"))

    def agent(p: AgentProxy) -> tuple[int, int]:
        url = p.base_url + "/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}]}
        return (httpx.post(url, json=body, timeout=TIMEOUT).status_code,
                httpx.post(url, json=body, headers={"Authorization": "Bearer skillstate-proxy-guess"},
                           timeout=TIMEOUT).status_code)

    _, codes = serve(model, agent)
    assert codes == (401, 401) and model.asked == []


@pytest.mark.parametrize("length", ["-1", "abc"])
def test_a_length_that_is_not_a_size_reads_no_body(length):
    """A negative or unreadable Content-Length is not read to the end of the connection: the body is empty."""
    model = Model(reply("never"))

    def agent(p: AgentProxy) -> int:
        import socket

        host, port = p.base_url.removeprefix("http://").removesuffix("/v1").split(":")
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as conn:
            conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {p.key}\r\n"
                         f"Content-Length: {length}\r\n\r\n".encode())
            return int(conn.recv(4096).split(b" ")[1])

    _, code = serve(model, agent)
    assert code == 400 and model.asked == []


def test_a_chunked_request_body_is_read():
    """A body sent with Transfer-Encoding: chunked (no Content-Length) is read whole, not as empty."""
    model = Model(reply("chunked"))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()

    def agent(p: AgentProxy) -> int:
        return httpx.post(p.base_url + "/chat/completions", content=iter([body[:10], body[10:]]),
                          headers={"Content-Type": "application/json", **auth(p)}, timeout=10).status_code

    _, code = serve(model, agent)
    assert code == 200 and len(model.asked) == 1


# -- Unix socket ------------------------------------------------------------------------------------------

def test_the_proxy_serves_a_unix_socket(tmp_path):
    """Listening on a Unix socket (as it does under bubblewrap), the proxy answers a request made over that
    socket, and removes the socket file when it closes."""
    path = tmp_path / "p.sock"
    model = Model(reply("over the socket"))

    with AgentProxy(model, unix_path=path) as proxy:
        def agent() -> httpx.Response:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=TIMEOUT) as client:
                return client.post("http://proxy/v1/chat/completions", headers=auth(proxy),
                                   json={"model": "any", "messages": [{"role": "user", "content": "hi"}]})

        assert path.exists()
        response = proxy.run_while(agent)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "over the socket"
    assert model.messages == [{"role": "user", "content": "hi"}]
    assert not path.exists()
