"""The journaling proxy an external agent's model calls go through.

Each harness rollout starts one (`AgentProxy`), bound to that rollout's target call: the run's
journaled client, with its budget, its concurrency cap and its failure policy. The agent reaches it
at a local URL. Under bubblewrap the proxy listens on a Unix socket bound into the sandbox, where
a small bridge (`bridge.py`) serves it on 127.0.0.1 inside the sandbox's own, otherwise empty,
network namespace: the agent reaches its model and nothing else. Without a sandbox it listens on
127.0.0.1 directly.

It answers POST .../chat/completions, .../responses and .../messages (Anthropic), streaming or not,
and GET .../models. A request is read into chat messages and tools (`protocols`), sent as one target
call, and the reply written back in the API the agent spoke. The agent holds no key of the run's: it is
given one made for its rollout (the proxy refuses any other), and the run's own key stays in the
driver. A target call that failed is answered with an error in the agent's API and marks the rollout
failed; an exception the call raised (the run's budget ran out, the endpoint is unusable) stops the
agent, and is raised again in the rollout.

The agent is not trusted with the driver's resources (`ProxyLimits`): past `connections` at once a
connection is answered 503 and closed where it is accepted, with no thread of its own; a request's line
and headers must arrive within `header_seconds` and `header_bytes` (else 408 or 431), its body within
`body_seconds` and `max_body` (else 408 or 413, refused on its declared length before it is read); one
request's body at a time is read and held (a second waits its turn); an answer the agent does not take
within `send_seconds` is dropped. Whatever the agent does, nothing is printed and nothing is raised in the
driver: a client that hangs up before its answer is not an error.
"""

from __future__ import annotations

import io
import json
import os
import queue
import re
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TypeVar, cast

from skillstate.envs.workspace.harness import MAX_DEPTH, nesting, plain_text
from skillstate.envs.workspace.proxy.bounds import (
    BoundedServer,
    DeadlineReader,
    Expired,
    ProxyLimits,
    TCPServer,
    TooLarge,
    UnixServer,
)
from skillstate.envs.workspace.proxy.protocols import (
    CHAT,
    MESSAGES,
    READERS,
    RESPONSES,
    WRITERS,
    BadRequest,
    Parsed,
    error_body,
)
from skillstate.llm.base import CallResult
from skillstate.util import redact

KEY_PREFIX = "skillstate-proxy-"  # the agent's key: made for one rollout, good for its proxy alone, never the run's
MB = 1024 * 1024
# A request body's size by default (`harness.proxy_max_body_mb`): an agent CLI sends its whole conversation
# with its tools' schemas each time, a few MB at most; a model's context window is far smaller.
MAX_BODY = 16 * MB
MAX_OPEN_REQUESTS = 8  # requests one agent may have open at once (they are answered one at a time anyway)
LINGER_BYTES = 64 * MB  # what is read and dropped of a refused request's body, so that its answer is not lost


Complete = Callable[..., CallResult]
R = TypeVar("R")
_WORD = re.compile(rb"\S+")


def route(path: str) -> str | None:
    """The API a POST path is for."""
    clean = path.split("?", 1)[0].rstrip("/")
    if clean.endswith("/chat/completions"):
        return CHAT
    if clean.endswith("/responses"):
        return RESPONSES
    if clean.endswith("/messages"):
        return MESSAGES
    return None


class AgentProxy:
    """One rollout's proxy: `calls` are the target calls it made, in order; `exchanges` what each request
    was (its API, whether streamed) and what it got; `failure` the first failed call's error. A request
    body is at most `max_body` bytes; `limits` bound the rest of what the agent may take."""

    def __init__(self, complete: Complete, unix_path: Path | None = None, *, max_body: int = MAX_BODY,
                 limits: ProxyLimits | None = None):
        self.complete = complete
        self.key = KEY_PREFIX + secrets.token_hex(16)  # what the agent must send (a local user is not the agent)
        self.stop = threading.Event()  # set when the run stops taking calls: the agent is then stopped
        self.max_body = max_body
        self.limits = limits or ProxyLimits()
        self._open_requests = threading.BoundedSemaphore(MAX_OPEN_REQUESTS)
        # One request's body is read and held at a time (a model request's until it is answered; they are
        # answered one at a time anyway), and one count_tokens request's: what a body costs once parsed is
        # many times its size, and it is not paid for each open request.
        self._reading = threading.Lock()
        self._counting = threading.Lock()
        self.calls: list[CallResult] = []
        self.exchanges: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.conversation: list[dict[str, Any]] = []  # the last request's messages and its reply
        self.raised: BaseException | None = None
        self._lock = threading.Lock()
        self._asked: queue.Queue[tuple[str, Any, list[Any], threading.Event]] = queue.Queue()
        self._open = True
        handler = self._handler()
        server: UnixServer | TCPServer
        if unix_path is not None:
            self.unix_path: Path | None = unix_path
            server = UnixServer(str(unix_path), handler)
        else:
            self.unix_path = None
            server = TCPServer(("127.0.0.1", 0), handler)
        server.slots = threading.BoundedSemaphore(self.limits.connections)
        self.httpd: socketserver.BaseServer = server
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="agent-proxy", daemon=True)

    @property
    def failed_connections(self) -> int:
        """Connections whose handling raised something other than the agent's own doing (none, but for a bug)."""
        return cast(BoundedServer, self.httpd).failed

    @property
    def base_url(self) -> str:
        """The URL on the driver's side (TCP only)."""
        host, port = cast(tuple[str, int], cast(Any, self.httpd).server_address[:2])
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> AgentProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.unix_path is not None:
            try:
                os.unlink(self.unix_path)
            except OSError:
                pass

    def run_while(self, work: Callable[[], R]) -> R:
        """Run `work` (the agent) on a thread of its own and answer its requests on this one until it returns.
        The target calls are made on the rollout's own thread, as a built-in rollout's are: the run's slot it
        holds, its lane (foreground or work done ahead) and its journal go with them."""
        done: list[Any] = []
        failed: list[BaseException] = []

        def go() -> None:
            try:
                done.append(work())
            except BaseException as err:  # noqa: BLE001 - raised again below
                failed.append(err)

        thread = threading.Thread(target=go, name="agent", daemon=True)
        thread.start()
        while thread.is_alive():  # what is still queued once the agent is gone is not sent: nobody waits for it
            try:
                api, body, out, ready = self._asked.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                out.append(self.answer(api, body))
            except Exception as err:  # noqa: BLE001 - the request's thread is answered whatever went wrong
                out.append((400, error_body(api, f"the request could not be answered ({type(err).__name__})")))
            finally:
                if not out:
                    out.append((400, error_body(api, "the rollout is over")))
                ready.set()
        with self._lock:
            self._open = False
        while not self._asked.empty():  # asked as the agent stopped: nobody is waiting for the answer
            _api, _body, out, ready = self._asked.get()
            out.append((400, error_body(_api, "the rollout is over")))
            ready.set()
        if failed:
            raise failed[0]
        return done[0]

    def ask(self, api: str, body: Any) -> tuple[int, dict[str, Any] | list[bytes]]:
        """From a request's thread: the answer, made on the rollout's thread."""
        out: list[Any] = []
        ready = threading.Event()
        with self._lock:
            if not self._open:
                return 400, error_body(api, "the rollout is over")
            self._asked.put((api, body, out, ready))
        ready.wait()
        return out[0]

    def answer(self, api: str, body: Any) -> tuple[int, dict[str, Any] | list[bytes]]:
        """(status, JSON body or server-sent events) for one request. Whatever the agent sent, it is answered: a
        request the proxy cannot read is a 400, never an error raised in the driver."""
        if nesting(body) > MAX_DEPTH:
            return 400, error_body(api, f"the request nests JSON more than {MAX_DEPTH} deep")
        try:
            parsed: Parsed = READERS[api](body)
            parsed.messages, parsed.tools = plain_text(parsed.messages), plain_text(parsed.tools)
        except BadRequest as err:
            return 400, error_body(api, str(err))
        except Exception as err:  # noqa: BLE001 - a field of the wrong shape, or anything else the agent shaped
            return 400, error_body(api, f"the request is not one this API takes ({type(err).__name__}: {err})")
        if self.raised is not None:  # the run is stopping: no more calls
            return 400, error_body(api, "the run stopped taking calls", "api_error")
        try:
            result = self.complete(parsed.messages, tools=parsed.tools or None)
        except BaseException as err:  # noqa: BLE001 - raised again in the rollout's thread
            with self._lock:
                self.raised = self.raised or err
            self.stop.set()
            return 400, error_body(api, "the run stopped taking calls", "api_error")
        error = redact(result.error) if result.error else None  # masked in the journal already; never the key
        with self._lock:
            self.calls.append(result)
            self.exchanges.append({"api": api, "stream": parsed.stream, "messages": len(parsed.messages),
                                   "tools": len(parsed.tools), "text": result.text,
                                   "tool_calls": [c.to_dict() for c in result.tool_calls], "error": error})
            reply: dict[str, Any] = {"role": "assistant", "content": result.text}
            if result.tool_calls:
                reply["tool_calls"] = [c.to_message() for c in result.tool_calls]
            self.conversation = [*parsed.messages, reply]
            if error and self.failure is None:
                self.failure = error
        if error:  # 400, not 5xx: the run's client already retried, and the agent should not
            return 400, error_body(api, f"the model call failed: {error}", "api_error")
        return 200, WRITERS[api](result, parsed)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        limits = self.limits

        class Handler(BaseHTTPRequestHandler):
            """One connection (one request: the answers are HTTP/1.0, so the connection closes after it). Every
            write is guarded: an agent that hung up, or stopped reading, only loses its answer."""

            reader: DeadlineReader

            def setup(self) -> None:
                super().setup()
                self.rfile.close()  # the socket file's reader: replaced by one with deadlines
                self.reader = DeadlineReader(self.connection)
                self.rfile = io.BufferedReader(self.reader)

            def handle_one_request(self) -> None:
                self.reader.expect(limits.header_seconds, limits.header_bytes)
                # what an answer refers to, should it be sent before the request line is in
                self.requestline, self.request_version, self.command, self.path = "", "HTTP/1.0", "", ""
                try:
                    super().handle_one_request()
                except TooLarge:
                    self._refuse(431, "the request's headers are too large", linger=True)
                except Expired:
                    self._refuse(408, "the request took too long to arrive", linger=False)
                except OSError:  # the agent hung up, or its connection broke: nobody to answer
                    self.close_connection = True

            def address_string(self) -> str:  # a Unix socket's peer has no address
                return "agent"

            def log_message(self, *args: Any) -> None:
                pass

            def flush_headers(self) -> None:
                """Every answer's first write: the agent has `send_seconds` to take it."""
                self.connection.settimeout(limits.send_seconds)
                super().flush_headers()

            def _json(self, code: int, body: dict[str, Any], close: bool = False) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if close:
                        self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the agent hung up (it was stopped, or gave up waiting)
                    self.close_connection = True

            def _refuse(self, code: int, message: str, linger: bool = True) -> None:
                """Answer `code` and close the connection; with `linger`, read and drop what the agent still
                sends of this request first (bounded), so that the answer reaches it rather than a reset."""
                api = route(self.path) or CHAT
                kind = {429: "rate_limit_error", 401: "authentication_error"}.get(code, "invalid_request_error")
                self.close_connection = True
                self._json(code, error_body(api, message, kind), close=True)
                if linger:
                    self._linger()

            def _linger(self) -> None:
                try:
                    self.connection.shutdown(socket.SHUT_WR)
                    until, left = time.monotonic() + limits.linger_seconds, LINGER_BYTES
                    while left > 0 and time.monotonic() < until:
                        self.connection.settimeout(max(0.001, until - time.monotonic()))
                        data = self.connection.recv(min(left, 65536))
                        if not data:
                            break
                        left -= len(data)
                except OSError:
                    pass

            def do_GET(self) -> None:
                if not self._allowed():
                    return
                if self.path.split("?", 1)[0].rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": "skillstate", "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def _allowed(self) -> bool:
                sent = self.headers.get("x-api-key") or self.headers.get("Authorization", "").partition(" ")[2]
                if secrets.compare_digest(sent.strip().encode(), proxy.key.encode()):
                    return True
                self._refuse(401, "not this rollout's key", linger=self.command == "POST")
                return False

            def do_POST(self) -> None:
                if not self._allowed():
                    return
                if not proxy._open_requests.acquire(blocking=False):
                    self._refuse(429, "too many requests at once")
                    return
                try:
                    self._post()
                finally:
                    proxy._open_requests.release()

            def _post(self) -> None:
                api = route(self.path)
                if self.path.split("?", 1)[0].rstrip("/").endswith("/messages/count_tokens"):
                    with proxy._counting:
                        self._count_tokens()
                    return
                if api is None:
                    self._refuse(404, f"no route {self.path}")
                    return
                with proxy._reading:  # the answer is written once the next request may be read
                    answer = self._answer(api)
                if answer is None:
                    self._refuse(413, f"request too large (more than {proxy.max_body:,} bytes)")
                    return
                code, out = answer
                if isinstance(out, dict):
                    self._json(code, out)
                else:
                    self._stream(code, out)

            def _answer(self, api: str) -> tuple[int, dict[str, Any] | list[bytes]] | None:
                """The request's body read and answered; None when it is too large."""
                raw = self._body()
                if raw is None:
                    return None
                try:
                    body = json.loads(raw or b"{}")
                except (ValueError, RecursionError):
                    return 400, error_body(api, "the body is not JSON")
                del raw  # the parsed body alone is held while the call is made
                return proxy.ask(api, body)

            def _stream(self, code: int, chunks: list[bytes]) -> None:
                """Server-sent events: all of them within `send_seconds`, or the rest is dropped."""
                self.close_connection = True
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    until = time.monotonic() + limits.send_seconds
                    for chunk in chunks:
                        left = until - time.monotonic()
                        if left <= 0:
                            return
                        self.connection.settimeout(left)
                        self.wfile.write(chunk)
                    self.wfile.flush()
                except OSError:  # the agent hung up, or stopped reading
                    pass

            def _body(self) -> bytes | bytearray | None:
                """The request's body, sent with a Content-Length or chunked, within `body_seconds`; None past
                `max_body` (refused on its declared length, or on the chunk that goes past it, before that is
                read). Held once: read into one buffer, never joined from parts."""
                self.reader.expect(limits.body_seconds)
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    body = bytearray()
                    while True:
                        line = self.rfile.readline(1024)
                        try:
                            n = int(line.split(b";")[0].strip() or b"0", 16)
                        except ValueError:
                            return b""
                        if n < 0:
                            return b""
                        if n == 0:
                            while self.rfile.readline(1024).strip():  # trailers
                                pass
                            return body
                        if len(body) + n > proxy.max_body:
                            return None
                        body += self.rfile.read(n)
                        self.rfile.readline(8)  # the CRLF after the chunk
                raw = (self.headers.get("Content-Length") or "0").strip()
                if not (raw.isascii() and raw.isdigit()):  # a negative or unreadable length ("²" is a digit): none
                    return b""
                length = int(raw)
                return None if length > proxy.max_body else self.rfile.read(length)

            def _count_tokens(self) -> None:
                """Claude Code asks how long a prompt is: the body's word count is the estimate (no model call,
                and nothing made of the body but the count)."""
                raw = self._body()
                if raw is None:
                    self._refuse(413, f"request too large (more than {proxy.max_body:,} bytes)")
                    return
                self._json(200, {"input_tokens": sum(1 for _ in _WORD.finditer(raw))})

        return Handler


__all__ = ["AgentProxy", "KEY_PREFIX", "MAX_BODY", "ProxyLimits", "route", "CHAT", "RESPONSES", "MESSAGES"]
