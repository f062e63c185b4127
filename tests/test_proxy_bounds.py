"""The journaling proxy against a hostile agent (issue 39, items 4 and 8): whatever an agent does to its
proxy, the driver keeps a bounded number of threads and bounded memory, prints nothing, and the rollout
goes on.

- connections: past `ProxyLimits.connections` at once, a connection is answered 503 and closed in the
  accept path, with no thread of its own;
- time: a request's line and headers must be in within `header_seconds` of its connection, and its body
  within `body_seconds` (else 408 and closed), however the bytes trickle in;
- size: the request line and headers are at most `header_bytes` (else 431), the body at most `max_body`
  (else 413, refused on its declared length before a byte of it is read);
- a client that hangs up before its reply (a 401, say) is not an error: no traceback is printed.

Each test ends with an honest request on the same proxy, answered as usual: the rollout goes on. The
tests wait for answers, never for a time: the bounds of time are set to a fraction of a second here.
"""

from __future__ import annotations

import json
import resource
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from skillstate.envs.workspace.proxy.server import AgentProxy, ProxyLimits
from skillstate.llm.base import CallResult
from skillstate.log.values import CallRef

WAIT = 10.0  # seconds a client waits for an answer the proxy gives at once (it never takes this long)
HEAD = "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
BODY = json.dumps({"model": "any", "messages": [{"role": "user", "content": "hi"}]}).encode()
MB = 1024 * 1024


class Model:
    """The rollout's target call, answering every request "fine" and counting them."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, messages: list[dict[str, Any]], tools: Any = None) -> CallResult:
        self.asked += 1
        return CallResult(ref=CallRef(request_hash="0" * 64, role="target", prompt_tokens=1, completion_tokens=1),
                          text="fine")


def proxy_for(over: str, tmp_path: Path, **kw: Any) -> AgentProxy:
    """A proxy on TCP, or on a Unix socket (as under bubblewrap, where the bridge relays each connection)."""
    return AgentProxy(Model(), tmp_path / "p.sock" if over == "unix" else None, **kw)


def connect(proxy: AgentProxy) -> socket.socket:
    if proxy.unix_path is not None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(proxy.unix_path))
    else:
        host, port = proxy.base_url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
        conn = socket.create_connection((host, int(port)))
    conn.settimeout(WAIT)
    return conn


def head(proxy: AgentProxy, *extra: str) -> bytes:
    """A request's line and headers with the rollout's key, then `extra` header lines."""
    return (HEAD + f"Authorization: Bearer {proxy.key}\r\n" + "".join(f"{h}\r\n" for h in extra) + "\r\n").encode()


def status_of(conn: socket.socket) -> int | None:
    """The status of the answer on `conn`; None when it was closed (or reset) without one."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else None


def closed(conn: socket.socket) -> bool:
    """Whether the proxy closed `conn` (read to its end, any answer dropped)."""
    try:
        while conn.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return True


def honest(proxy: AgentProxy) -> int:
    """An honest request, as an agent's HTTP client sends it: its status."""
    if proxy.unix_path is not None:
        transport = httpx.HTTPTransport(uds=str(proxy.unix_path))
        with httpx.Client(transport=transport, timeout=WAIT) as client:
            return client.post("http://proxy/v1/chat/completions", content=BODY,
                               headers={"Authorization": f"Bearer {proxy.key}"}).status_code
    return httpx.post(proxy.base_url + "/chat/completions", content=BODY, timeout=WAIT,
                      headers={"Authorization": f"Bearer {proxy.key}"}).status_code


def settled(baseline: int) -> None:
    """Wait until the proxy's connection threads have ended (at most the agent's and the server's remain)."""
    give_up = time.monotonic() + 60
    while threading.active_count() > baseline + 2 and time.monotonic() < give_up:
        time.sleep(0.01)


def flood_size() -> int:
    """3,000 connections, or as many as this process may open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 3_000 + 200
    if soft < want and (hard == resource.RLIM_INFINITY or hard >= want):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return min(3_000, soft - 200)


# -- connections ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_a_flood_of_idle_connections_gets_no_thread_each_and_the_rollout_goes_on(over, tmp_path):
    """3,000 idle connections (what one hostile rollout opened): the driver's threads stay within the bound,
    a connection past it is answered 503 at once, and once they are gone an honest request is answered."""
    n = flood_size()
    baseline = threading.active_count()
    with proxy_for(over, tmp_path) as proxy:
        def agent() -> tuple[int, int | None, int]:
            conns = [connect(proxy) for _ in range(n)]
            peak = threading.active_count()
            last = status_of(conns[-1])  # past the bound: answered without a thread of its own
            for conn in conns:
                conn.close()
            settled(baseline)
            return peak, last, honest(proxy)

        peak, last, code = proxy.run_while(agent)
    bound = ProxyLimits().connections
    assert peak - baseline <= bound + 2, f"{peak - baseline} threads for {n} connections"
    assert last == 503
    assert code == 200 and proxy.raised is None and proxy.failed_connections == 0


# -- size -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_a_body_past_the_default_limit_is_413_before_it_is_read(over, tmp_path):
    """The default limit is 16 MB (every real agent request fits): a request that declares more is refused
    on its Content-Length, without waiting for the body; the rollout goes on."""
    with proxy_for(over, tmp_path) as proxy:
        def agent() -> tuple[int | None, int]:
            with connect(proxy) as conn:
                conn.sendall(head(proxy, f"Content-Length: {16 * MB + 1}"))
                return status_of(conn), honest(proxy)

        refused, code = proxy.run_while(agent)
    assert refused == 413
    assert code == 200 and proxy.calls and proxy.raised is None and proxy.failed_connections == 0


def test_the_body_limit_is_settable_and_holds_for_chunked_bodies(tmp_path):
    """With `max_body` of 1,000 bytes: a declared length past it, or chunks adding up past it, are 413; a
    body within it is read as usual."""
    with AgentProxy(Model(), max_body=1_000) as proxy:
        def agent() -> list[int | None]:
            codes = []
            with connect(proxy) as conn:
                conn.sendall(head(proxy, "Content-Length: 1001"))
                codes.append(status_of(conn))
            with connect(proxy) as conn:  # 600 + 600 bytes in two chunks: refused at the second chunk's size
                conn.sendall(head(proxy, "Transfer-Encoding: chunked") + b"258\r\n" + b" " * 600 + b"\r\n258\r\n")
                codes.append(status_of(conn))
            codes.append(honest(proxy))
            return codes

        codes = proxy.run_while(agent)
    assert codes == [413, 413, 200] and proxy.failed_connections == 0


def test_a_header_block_past_its_limit_is_431(tmp_path):
    """80 header lines of 1 KB (80 KB, past the 64 KB the proxy reads of a request's head) are refused."""
    with AgentProxy(Model()) as proxy:
        def agent() -> tuple[int | None, int]:
            with connect(proxy) as conn:
                extra = [f"X-Filler-{i}: {'a' * 1000}" for i in range(80)]
                conn.sendall(head(proxy, *extra, f"Content-Length: {len(BODY)}") + BODY)
                return status_of(conn), honest(proxy)

        refused, code = proxy.run_while(agent)
    assert refused == 431
    assert code == 200 and proxy.calls and proxy.raised is None and proxy.failed_connections == 0


# -- time -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_headers_or_a_body_that_never_end_are_408(over, tmp_path):
    """Headers begun and never finished, a body shorter than its Content-Length, or nothing at all, are
    answered 408 once their time is up, and the connection closed."""
    limits = ProxyLimits(header_seconds=0.2, body_seconds=0.2)
    with proxy_for(over, tmp_path, limits=limits) as proxy:
        def agent() -> list[Any]:
            out: list[Any] = []
            with connect(proxy) as conn:
                conn.sendall(HEAD.encode())  # and never the blank line
                out.append(status_of(conn))
            with connect(proxy) as conn:
                conn.sendall(head(proxy, "Content-Length: 100") + b'{"model"')
                out.append(status_of(conn))
            with connect(proxy) as conn:
                out.append(status_of(conn))
                out.append(closed(conn))
            out.append(honest(proxy))
            return out

        out = proxy.run_while(agent)
    assert out == [408, 408, 408, True, 200] and proxy.failed_connections == 0


def test_a_slow_trickle_cannot_hold_a_connection_past_the_header_deadline(tmp_path):
    """A byte of the headers every 20 ms: no read waits long, but the deadline is for the whole head."""
    limits = ProxyLimits(header_seconds=0.3)
    with AgentProxy(Model(), limits=limits) as proxy:
        def agent() -> int | None:
            with connect(proxy) as conn:
                stop = threading.Event()

                def trickle() -> None:
                    for byte in HEAD.encode() * 100:
                        if stop.wait(0.02):
                            return
                        try:
                            conn.send(bytes([byte]))
                        except OSError:
                            return

                sender = threading.Thread(target=trickle, daemon=True)
                sender.start()
                try:
                    return status_of(conn)
                finally:
                    stop.set()
                    sender.join()

        assert proxy.run_while(agent) == 408
    assert proxy.failed_connections == 0


# -- no traceback -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("over", ["unix", "tcp"])
def test_a_client_that_hangs_up_before_its_reply_prints_nothing(over, tmp_path, capfd):
    """Requests without the key whose client is gone before the 401 is written (over a Unix socket the write
    always fails; over TCP the connection is reset): nothing is printed, and the rollout goes on."""
    baseline = threading.active_count()
    with proxy_for(over, tmp_path) as proxy:
        def agent() -> int:
            for _ in range(30):
                conn = connect(proxy)
                conn.sendall(f"{HEAD}Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)
                if proxy.unix_path is None:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
                conn.close()
            settled(baseline)
            return honest(proxy)

        code = proxy.run_while(agent)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception" not in err, err
    assert code == 200 and proxy.failed_connections == 0


def test_a_handler_that_fails_prints_nothing(tmp_path, capfd, monkeypatch):
    """Whatever goes wrong in serving one connection, socketserver prints no traceback for it."""
    from http.server import BaseHTTPRequestHandler

    def broken(self: Any) -> None:
        raise RuntimeError("a fault in serving this request")

    with AgentProxy(Model()) as proxy:
        monkeypatch.setattr(BaseHTTPRequestHandler, "handle_one_request", broken)
        with pytest.raises(httpx.HTTPError):
            httpx.get(proxy.base_url + "/models", timeout=WAIT)
        monkeypatch.undo()
        assert httpx.get(proxy.base_url + "/models", timeout=WAIT,
                         headers={"Authorization": f"Bearer {proxy.key}"}).status_code == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "a fault in serving" not in err, err
    assert proxy.failed_connections == 1  # counted, not printed


# -- the harness setting ----------------------------------------------------------------------------------

AGENT = """
import json, os, sys, urllib.request, urllib.error
body = json.dumps({"messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                          "Content-Type": "application/json"})
try:
    print("status", urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as err:
    print("status", err.code)
except OSError as err:
    print("closed", err)
"""


@pytest.mark.parametrize("mb, said", [(2, "status 413"), (4, "status 200")])
def test_harness_proxy_max_body_mb_is_the_rollouts_limit(tmp_path, mb, said):
    """`env_config.harness.proxy_max_body_mb` sets the limit of the rollout's proxy: a 3 MB request is refused
    under 2 MB and answered under 4; a refused one fails the rollout, nothing is raised."""
    from skillstate.envs.registry import env_settings, resolve_env
    from skillstate.envs.workspace.harness import HarnessSettings
    from skillstate.envs.workspace.tasks import bundled_splits

    assert HarnessSettings().proxy_max_body_mb == 16
    cls = resolve_env("workspace")
    settings = env_settings(cls, {"sandbox": {"kind": "none"}, "harness": {
        "kind": "command", "command": [sys.executable, "-c", AGENT], "wall_seconds": 60,
        "proxy_max_body_mb": mb}}, "workspace")
    env = cls({"train": [], "val": [], "test": []}, settings)
    item = bundled_splits(["train"])["train"][0]
    model = Model()
    outcome = env.rollout("Be careful.", item, model, {})
    log = outcome.trajectory["log"]
    assert any(said in line for line in log), log
    assert model.asked == (1 if said == "status 200" else 0)
