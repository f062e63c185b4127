"""What an agent may take of the driver through its proxy: the limits (`ProxyLimits`), a connection's read
side that keeps a deadline and a size allowance (`DeadlineReader`), and threading servers that serve a bounded
number of connections at once, answering one more 503 where it is accepted, with no thread of its own
(`UnixServer`, `TCPServer`). Nothing a client does makes them print or raise in the driver."""

from __future__ import annotations

import io
import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from http.server import HTTPServer
from typing import Any, cast


@dataclass(frozen=True)
class ProxyLimits:
    """What one agent may take of the driver through its proxy (the body's size is `AgentProxy`'s max_body)."""

    connections: int = 32  # open at once (an agent CLI opens a few); past it: 503, closed, no thread started
    header_bytes: int = 64 * 1024  # a request's line and headers (an agent's are a few KB); past it: 431
    header_seconds: float = 30.0  # from the connection to the end of the headers; past it: 408
    body_seconds: float = 120.0  # to read a body (16 MB over the loopback takes milliseconds); past it: 408
    send_seconds: float = 60.0  # for the agent to take an answer; past it, the connection is dropped
    linger_seconds: float = 2.0  # reading what remains of a refused request before the connection is closed


class Expired(Exception):
    """The time to read a request's head, or its body, is up."""


class TooLarge(Exception):
    """A request's head is past `header_bytes`."""


class DeadlineReader(io.RawIOBase):
    """A connection's read side, for a buffered reader: each read waits no later than the deadline of what
    is being read (the request's head, then its body), and the head is read up to `allowance` bytes."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.deadline = time.monotonic()
        self.allowance: int | None = None

    def readable(self) -> bool:
        return True

    def expect(self, seconds: float, allowance: int | None = None) -> None:
        """What comes next must be in within `seconds` (and `allowance` bytes, if given)."""
        self.deadline, self.allowance = time.monotonic() + seconds, allowance

    def readinto(self, buffer: Any) -> int:
        if self.allowance is not None and self.allowance <= 0:
            raise TooLarge
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Expired
        view = memoryview(buffer).cast("B")
        if self.allowance is not None:
            view = view[:self.allowance]
        self.sock.settimeout(left)
        try:
            n = self.sock.recv_into(view)
        except TimeoutError:
            raise Expired from None
        if self.allowance is not None:
            self.allowance -= n
        return n


def answer_busy(sock: socket.socket) -> None:
    """Answer a connection past the bound 503 without waiting on it (the answer fits the socket's buffer)."""
    data = json.dumps({"error": {"message": "too many connections at once", "type": "overloaded_error"}}).encode()
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
            "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.setblocking(False)
        sock.send(head + data)
    except OSError:
        pass


class BoundedServer(socketserver.ThreadingMixIn):
    """A threading server that serves at most `slots` connections at once: one more is answered 503 and
    closed in the accept path, where no thread is started for it. Nothing a client does prints anything."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: a burst of connections waits to be accepted, none is dropped
    slots: threading.BoundedSemaphore
    failed = 0  # connections whose handling raised (the agent's own doing is handled before that)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            answer_busy(request)
            cast(socketserver.BaseServer, self).shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: the slot is free again (the caller closes the connection)
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback here; a connection that failed is counted and closed."""
        self.failed += 1


class UnixServer(BoundedServer, socketserver.UnixStreamServer):
    pass


class TCPServer(BoundedServer, HTTPServer):
    pass
