"""The openai backend, through the real `openai` client, against the local
OpenAI-compatible sim server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES
from sqlalchemy import MetaData, select

from skillstate.cli.main import cli
from skillstate.config import ModelConfig
from skillstate.llm.base import ChatRequest
from skillstate.llm.openai_backend import OpenAIBackend
from skillstate.storage.store import Store

SECRET = "sk-test-SECRET-0123456789abcdef"


def _run_args(server, db, *extra):
    return ["run", "--backend", "openai", "--model", "sim-model", "--base-url", server.base_url,
            "--data", str(EXAMPLES / "qa"), "--batch-size", "12", "--epochs", "2", "--db", db, *extra]


def _dump(url: str) -> str:
    """Every value in every table, as text."""
    store = Store(url)
    meta = MetaData()
    meta.reflect(store.engine)
    out = []
    with store.engine.connect() as conn:
        for table in meta.sorted_tables:
            for row in conn.execute(select(table)):
                out.append(repr(tuple(row)))
    blobs = [store.get_blob(h) for (h,) in store.engine.connect().execute(select(meta.tables["blobs"].c.hash))]
    store.close()
    return "\n".join(out + blobs)


def test_full_run_through_the_openai_client(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'o.db'}"
    res = CliRunner().invoke(cli, _run_args(sim_server, db, "--run-id", "o"), env={"OPENAI_API_KEY": SECRET})
    assert res.exit_code == 0, res.output
    summary = json.loads(CliRunner().invoke(cli, ["show", "o", "--json", "--db", db]).output)
    assert summary["status"] == "completed"
    assert summary["best_score"] > summary["baseline_score"]
    sent = sum(u["sent"] for u in summary["usage"].values())
    assert sent == sim_server.requests > 0
    assert all(h == f"Bearer {SECRET}" for h in sim_server.auth_headers)
    assert summary["usage"]["target"]["prompt_tokens"] > 0  # usage from the server's replies


def test_secrets_never_reach_the_log_or_the_output(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 's.db'}"
    host, port = sim_server.httpd.server_address[:2]
    url = f"http://user:{SECRET}@{host}:{port}/v1"
    args = _run_args(sim_server, db, "--run-id", "s")
    args[args.index("--base-url") + 1] = url
    outputs = [CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": SECRET})]
    assert outputs[0].exit_code == 0, outputs[0].output
    for cmd in (["log", "--json"], ["show", "--json"], ["runs", "--json"], ["replay", "--to-step", "1", "--json"],
                ["audit"], ["replay", "--verify"]):
        outputs.append(CliRunner().invoke(cli, [*cmd, "--db", db]))
    for res in outputs:
        assert SECRET not in res.output
    dump = _dump(db)
    assert SECRET not in dump
    started = json.loads(CliRunner().invoke(cli, ["log", "s", "--json", "--db", db]).output)[0]
    assert started["payload"]["config"]["target"]["base_url"] == f"http://***@{host}:{port}/v1"
    # a fork that sets a credential-bearing URL records it masked too
    fork = CliRunner().invoke(cli, ["fork", "s", "1", "--run-id", "s2", "--no-run", "--set",
                                    f"optimizer.base_url={url}", "--db", db], env={"OPENAI_API_KEY": SECRET})
    assert fork.exit_code == 0, fork.output
    assert SECRET not in fork.output and SECRET not in _dump(db)


def test_rate_limits_are_retried_honouring_retry_after(sim_server):
    sim_server.fail_first, sim_server.retry_after = 2, 0.2
    backend = OpenAIBackend(ModelConfig(base_url=sim_server.base_url, max_retries=3, api_key_env="SK_TEST"),
                            "target") if _set_key() else None
    req = ChatRequest.build("openai", "m", [{"role": "system", "content": "# s"},
                                            {"role": "user", "content": "Question: What is 2 + 3 × 4?"}], 0.0, 16)
    resp = backend.complete(req)
    assert sim_server.requests == 3  # two 429s, then the answer
    assert resp.text and resp.prompt_tokens > 0


def test_exhausted_retries_become_recorded_call_errors_and_the_breaker_stops_the_run(sim_server, tmp_path):
    sim_server.fail_first = 10_000
    db = f"sqlite:///{tmp_path / 'r.db'}"
    res = CliRunner().invoke(cli, _run_args(sim_server, db, "--run-id", "r", "--set", "target.max_retries=0",
                                            "--set", "optimizer.max_retries=0", "--epochs", "1"),
                             env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 4, res.output
    assert "16 LLM calls in a row failed" in res.output and "HTTP 429 after 1 attempt: rate limited" in res.output
    assert "skillstate resume r --db" in res.output
    events = json.loads(CliRunner().invoke(cli, ["log", "r", "--json", "--db", db]).output)
    assert [e["type"] for e in events] == ["RunStarted"]  # the failed baseline was not appended
    store = Store(db)
    calls = store.read_calls("r")
    assert calls and all(c.error.startswith("HTTP 429") for c in calls)
    store.close()


def test_unreachable_endpoint_is_a_user_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["run", "--backend", "openai", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1",
            "--data", str(EXAMPLES / "qa"), "--set", "target.max_retries=0", "--db", f"sqlite:///{tmp_path / 'u.db'}"]
    res = CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 2 and "cannot reach the target endpoint" in res.output
    assert "Traceback" not in res.output


def test_a_finished_openai_run_replays_and_resumes_without_the_server(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'n.db'}"
    res = CliRunner().invoke(cli, _run_args(sim_server, db, "--run-id", "n"), env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 0
    sim_server.stop()
    res = CliRunner().invoke(cli, ["replay", "n", "--verify", "--db", db])
    assert res.exit_code == 0 and "reproduces all" in res.output
    res = CliRunner().invoke(cli, ["fork", "n", "step_1", "--lr", "constant", "-q", "--no-run", "--db", db],
                             env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 0, res.output


def _set_key() -> bool:
    import os

    os.environ["SK_TEST"] = "k"
    return True


def test_the_sim_server_reads_content_parts_and_refuses_bad_messages_in_one_reply(sim_server):
    """Agent CLIs (Qwen Code among them) send message content as a list of parts."""
    import openai
    import pytest

    client = openai.OpenAI(base_url=sim_server.base_url, api_key="k", max_retries=0)
    question = "Question: What is 2 + 3 × 4?"
    parts = [{"type": "text", "text": question[:10]}, {"type": "text", "text": question[10:]}]
    system = {"role": "system", "content": "# s"}
    reply = client.chat.completions.create(model="m", messages=[system, {"role": "user", "content": parts}])
    plain = client.chat.completions.create(model="m", messages=[system, {"role": "user", "content": question}])
    assert reply.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="messages must be a list of objects"):
        client.chat.completions.create(model="m", messages=["not a message"])  # type: ignore[list-item]


class _Capture:
    """A local endpoint that keeps each request it is sent (path, headers, body) and answers a fixed reply."""

    REPLY = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []
        reply = json.dumps(self.REPLY).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("azure", [False, True])
def test_the_backend_posts_what_the_openai_clients_create_posts(azure, monkeypatch):
    # the backend posts the body itself (no per-call pass over the client's type hints): the request on the
    # wire, Azure's deployment path included, is the one `chat.completions.with_raw_response.create` sends
    server = _Capture()
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    try:
        cfg = ModelConfig(model="m", base_url=server.url + ("" if azure else "/v1"), azure=azure,
                          max_tokens_param="max_completion_tokens")
        backend = OpenAIBackend(cfg, "target")
        tools = [{"type": "function", "function": {"name": "look", "description": "Look.",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
        messages = [{"role": "system", "content": "skill é"}, {"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "t1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "a room"}]
        request = ChatRequest.build("openai", "m", messages, 0.3, 64, response_format=schema, tools=tools, seed=7,
                                    extra_body={"repeat_penalty": 1.1, "top_k": 20})
        reply = backend.complete(request)
        assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == ("4", 5, 1)
        backend.client.chat.completions.with_raw_response.create(
            model="m", messages=request.message_dicts(), max_completion_tokens=64, temperature=0.3,
            response_format=schema, tools=tools, seed=7, extra_body={"repeat_penalty": 1.1, "top_k": 20})
        (path, headers, body), (want_path, want_headers, want_body) = server.seen
        assert path == want_path and path.split("?")[0].endswith("/chat/completions")
        assert ("/deployments/m/" in path) == azure
        assert json.loads(body) == json.loads(want_body) and json.loads(body)["top_k"] == 20  # (keys in other order)
        assert headers == want_headers
    finally:
        server.close()
