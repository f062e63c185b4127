"""The sim world behind an OpenAI-compatible HTTP API, on 127.0.0.1.

For trying `--backend openai` offline and for the project's tests, which
drive it through the real `openai` client. It answers POST
/v1/chat/completions and POST /v1/embeddings (the sim embedder's vectors; the
skill bank's `bank.embedder: openai` uses it in tests), GET /v1/models,
requires a bearer token on chat completions, and can
be told to answer the first N requests with 429 + Retry-After to exercise
client retries, or to misbehave in any way a `Fault` describes (the tests of
the failure policy use that).

`latency` holds every chat completion (and every embeddings request, however
many texts it carries) back that many seconds, as a hosted model's round
trip would. Each request is served on its own thread, so the
delay overlaps across concurrent requests: it never queues them. `calls`
counts the answered chat completions per role (target, optimizer) and
`spans` keeps each one's (role, start, end) on the monotonic clock, so a
benchmark counts every client's calls the same way, at the server.

A chat completion that carries a `json_schema` response_format is answered
the way llama.cpp answers it (`constrained_reply`): the reply's fields in the
schema's property order, and a field the model would write after one that
the schema puts later is lost, as under llama.cpp's grammar.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from skillstate.bank.embedding import SimEmbedder
from skillstate.sim.backend import SimBackend


def text_messages(raw: Any) -> list[dict[str, Any]] | None:
    """The messages with each content as text: a list of content parts (as Qwen Code and the OpenAI clients
    may send) becomes the text of its text parts, in order; None when `raw` is not a list of objects."""
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        return None
    out = []
    for message in raw:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content
                              if isinstance(part, dict) and part.get("type") in ("text", "input_text"))
        out.append({**message, "content": content})
    return out


def constrained_reply(text: str, response_format: Any) -> str:
    """`text` as a server that constrains the output to a `json_schema` response_format writes it.

    llama.cpp turns the schema into a grammar: an object's required properties come first, then its
    optional ones, each group in the order the schema lists them, each optional one skippable. The sim
    model writes its fields in its own order (that of the prompt's example); once it has written an
    optional field, one the schema lists before it is no longer allowed and is lost (a required field it
    did not write is forced, empty). So a schema sent with its keys sorted, which puts an edit's `content`
    before its `target`, loses the content of every edit that names its target first. A reply that is not
    a JSON object, or a request without a json_schema, is answered as it is."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return text
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    if not isinstance(schema, dict) or not isinstance(value, dict):
        return text
    return json.dumps(_in_schema_order(value, schema, schema))


def _resolve(schema: Any, root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, dict) else {}
    return schema if isinstance(schema, dict) else {}


def _in_schema_order(value: Any, schema: Any, root: dict[str, Any]) -> Any:
    schema = _resolve(schema, root)
    props = schema.get("properties")
    if isinstance(value, dict) and isinstance(props, dict):
        required = [k for k in props if k in set(schema.get("required") or [])]
        optional = [k for k in props if k not in required]
        out = {k: _in_schema_order(value[k], props[k], root) if k in value else _empty(props[k], root)
               for k in required}
        last = -1
        for k in value:  # the model's own order
            if k in optional and optional.index(k) > last:
                out[k] = _in_schema_order(value[k], props[k], root)
                last = optional.index(k)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_in_schema_order(v, schema["items"], root) for v in value]
    return value


def _empty(schema: Any, root: dict[str, Any]) -> Any:
    kind = _resolve(schema, root).get("type")
    return {"string": "", "array": [], "object": {}, "integer": 0, "number": 0, "boolean": False}.get(str(kind))


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the listen backlog: more than any client's concurrency, so no connect is dropped


@dataclass(frozen=True)
class Fault:
    """How to answer one request instead of the sim's reply: a status and a
    raw body, after an optional delay; or close the connection unanswered."""

    status: int = 200
    body: str = ""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False


# (chat request number from 1, or 0 for a GET; path; request body) -> a Fault, or None for the normal reply
FaultRule = Callable[[int, str, dict[str, Any]], "Fault | None"]

# What GET /v1/models lists: any model name is served, these are the names the docs and tests use.
SIM_MODEL_IDS = ("sim", "sim-model", "sim-target", "sim-optimizer", "sim-judge")


class SimServer:
    def __init__(self, world: Any, host: str = "127.0.0.1", port: int = 0, *,
                 fail_first: int = 0, retry_after: float = 0.0, fault: FaultRule | None = None,
                 latency: float = 0.0):
        if latency < 0:
            raise ValueError(f"latency must be at least 0 seconds, got {latency}")
        self.backend = SimBackend(world)
        self.fail_first = fail_first
        self.retry_after = retry_after
        self.fault = fault
        self.latency = latency
        self.requests = 0
        self.embedding_requests = 0
        self.auth_headers: list[str] = []
        self.calls: dict[str, int] = {"target": 0, "optimizer": 0}
        self.spans: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()
        self.httpd = _Server((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        # cast: an AF_INET server's address is (host as str, port); typeshed also allows a bytes host
        host, port = cast(tuple[str, int], self.httpd.server_address[:2])
        return f"http://{host}:{port}/v1"

    def start(self) -> SimServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="sim-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _count(self, role: str, start: float) -> None:
        with self._lock:
            self.calls[role] = self.calls.get(role, 0) + 1
            self.spans.append((role, start, time.monotonic()))

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _misbehave(self, fault: Fault) -> None:
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.drop:
                    self.close_connection = True
                    self.connection.shutdown(2)  # socket.SHUT_RDWR: no reply at all
                    return
                data = fault.body.encode()
                self.send_response(fault.status)
                self.send_header("Content-Type", fault.content_type)
                self.send_header("Content-Length", str(len(data)))
                for k, v in fault.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fault = server.fault(0, self.path, {}) if server.fault is not None else None
                if fault is not None:
                    self._misbehave(fault)
                elif not self.headers.get("Authorization", "").partition(" ")[2].strip():
                    self._send(401, {"error": {"message": "missing API key", "type": "invalid_request_error"}})
                elif self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in SIM_MODEL_IDS]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def _embeddings(self, body: dict[str, Any]) -> None:
                """The sim embedder's vectors, in the shape of OpenAI's embeddings API (no auth check needed
                beyond the chat route's: it is the same server)."""
                texts = body.get("input")
                texts = [texts] if isinstance(texts, str) else texts
                if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                    self._send(400, {"error": {"message": "input must be a string or a list of strings"}})
                    return
                if server.latency:  # one round trip, however many texts it carries
                    time.sleep(server.latency)
                vectors = SimEmbedder().embed(texts)
                tokens = sum(len(t.split()) for t in texts)
                with server._lock:
                    server.embedding_requests += 1
                self._send(200, {"object": "list", "model": body.get("model", "sim-embedding"),
                                 "data": [{"object": "embedding", "index": i, "embedding": v}
                                          for i, v in enumerate(vectors)],
                                 "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

            def do_POST(self) -> None:
                start = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "invalid JSON"}})
                    return
                if self.path.rstrip("/").endswith("/embeddings"):
                    self._embeddings(body)
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                auth = self.headers.get("Authorization", "")
                with server._lock:
                    server.requests += 1
                    n = server.requests
                    server.auth_headers.append(auth)
                scheme, _, credential = auth.partition(" ")
                if scheme not in ("Bearer", "Basic") or not credential.strip():
                    self._send(401, {"error": {"message": "missing API key", "type": "invalid_request_error"}})
                    return
                if n <= server.fail_first:
                    self._send(429, {"error": {"message": "rate limited", "type": "rate_limit"}},
                               {"Retry-After": str(server.retry_after)})
                    return
                fault = server.fault(n, self.path, body) if server.fault is not None else None
                if fault is not None:
                    self._misbehave(fault)
                    return
                messages = text_messages(body.get("messages") or [])
                if messages is None:
                    self._send(400, {"error": {"message": "messages must be a list of objects",
                                               "type": "invalid_request_error"}})
                    return
                try:
                    seed = body.get("seed") if isinstance(body.get("seed"), int) else None
                    role, reply = server.backend.answer(messages, body.get("tools") or [], seed)
                except LookupError as err:  # a task this world does not hold: the server plays another env
                    self._send(400, {"error": {"message": str(err), "type": "invalid_request_error"}})
                    return
                reply = dataclasses.replace(reply, text=constrained_reply(reply.text, body.get("response_format")))
                # as OpenAI does: content null when the reply is only tool calls
                message: dict[str, Any] = {"role": "assistant",
                                           "content": reply.text if reply.text or not reply.tool_calls else None}
                if reply.tool_calls:
                    message["tool_calls"] = [c.to_message() for c in reply.tool_calls]
                if server.latency:
                    time.sleep(max(0.0, server.latency - (time.monotonic() - start)))  # this thread only
                server._count(role, start)
                self._send(200, {
                    "id": f"chatcmpl-sim-{n}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "sim"),
                    "choices": [{"index": 0, "finish_reason": reply.finish_reason, "message": message}],
                    "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                              "total_tokens": reply.prompt_tokens + reply.completion_tokens},
                })

        return Handler
