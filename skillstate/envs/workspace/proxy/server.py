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
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar, cast

from skillstate.envs.workspace.harness import plain_text
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
MAX_BODY = 64 * 1024 * 1024
MAX_OPEN_REQUESTS = 8  # requests one agent may have open at once (they are answered one at a time anyway)

Complete = Callable[..., CallResult]
R = TypeVar("R")


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


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _TCPServer(ThreadingHTTPServer):
    daemon_threads = True


class AgentProxy:
    """One rollout's proxy: `calls` are the target calls it made, in order; `exchanges` what each request
    was (its API, whether streamed) and what it got; `failure` the first failed call's error."""

    def __init__(self, complete: Complete, unix_path: Path | None = None):
        self.complete = complete
        self.key = KEY_PREFIX + secrets.token_hex(16)  # what the agent must send (a local user is not the agent)
        self.stop = threading.Event()  # set when the run stops taking calls: the agent is then stopped
        self._open_requests = threading.BoundedSemaphore(MAX_OPEN_REQUESTS)
        self.calls: list[CallResult] = []
        self.exchanges: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.conversation: list[dict[str, Any]] = []  # the last request's messages and its reply
        self.raised: BaseException | None = None
        self._lock = threading.Lock()
        self._asked: queue.Queue[tuple[str, Any, list[Any], threading.Event]] = queue.Queue()
        self._open = True
        handler = self._handler()
        if unix_path is not None:
            self.unix_path: Path | None = unix_path
            self.httpd: socketserver.BaseServer = _UnixServer(str(unix_path), handler)
        else:
            self.unix_path = None
            self.httpd = _TCPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="agent-proxy", daemon=True)

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
            out.append(self.answer(api, body))
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
        """(status, JSON body or server-sent events) for one request."""
        try:
            parsed: Parsed = READERS[api](body)
        except BadRequest as err:
            return 400, error_body(api, str(err))
        except (TypeError, AttributeError, KeyError, ValueError) as err:  # a field of the wrong shape
            return 400, error_body(api, f"the request is not one this API takes ({type(err).__name__}: {err})")
        parsed.messages, parsed.tools = plain_text(parsed.messages), plain_text(parsed.tools)
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

        class Handler(BaseHTTPRequestHandler):
            def address_string(self) -> str:  # a Unix socket's peer has no address
                return "agent"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:  # the agent hung up (it was stopped, or gave up waiting)
                    self.close_connection = True

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
                self._json(401, {"error": {"message": "not this rollout's key", "type": "authentication_error"}})
                return False

            def do_POST(self) -> None:
                if not self._allowed():
                    return
                if not proxy._open_requests.acquire(blocking=False):
                    self._json(429, {"error": {"message": "too many requests at once", "type": "rate_limit_error"}})
                    return
                try:
                    self._post()
                finally:
                    proxy._open_requests.release()

            def _post(self) -> None:
                api = route(self.path)
                if self.path.split("?", 1)[0].rstrip("/").endswith("/messages/count_tokens"):
                    self._count_tokens()
                    return
                if api is None:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                raw = self._body()
                if raw is None:
                    self._json(413, error_body(api, "request too large"))
                    return
                try:
                    body = json.loads(raw or b"{}")
                except (ValueError, RecursionError):
                    self._json(400, error_body(api, "the body is not JSON"))
                    return
                code, out = proxy.ask(api, body)
                if isinstance(out, dict):
                    self._json(code, out)
                    return
                self.send_response(code)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    for chunk in out:
                        self.wfile.write(chunk)
                    self.wfile.flush()
                except OSError:  # the agent hung up
                    pass

            def _body(self) -> bytes | None:
                """The request's body, sent with a Content-Length or chunked; None past MAX_BODY."""
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    parts: list[bytes] = []
                    size = 0
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
                            return b"".join(parts)
                        size += n
                        if size > MAX_BODY:
                            return None
                        parts.append(self.rfile.read(n))
                        self.rfile.readline(8)  # the CRLF after the chunk
                raw = (self.headers.get("Content-Length") or "0").strip()
                if not raw.isdigit():  # a negative or unreadable length: no body
                    return b""
                length = int(raw)
                return None if length > MAX_BODY else self.rfile.read(length)

            def _count_tokens(self) -> None:
                """Claude Code asks how long a prompt is: a word count is the estimate (no model call)."""
                try:
                    body = json.loads(self._body() or b"{}")
                except (ValueError, RecursionError):
                    body = {}
                self._json(200, {"input_tokens": len(json.dumps(body).split())})

        return Handler


__all__ = ["AgentProxy", "KEY_PREFIX", "route", "CHAT", "RESPONSES", "MESSAGES"]
