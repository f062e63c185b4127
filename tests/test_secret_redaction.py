"""The run's own keys never leak through an error (issue 39, item 5).

An endpoint's error message may quote the key it was sent, whatever the key's shape (an Azure key is 32
hex digits, a local server's any string). Each key a role resolves is registered as a secret, and
`redact` masks its exact string wherever an error is stored (llm_calls.error, a rollout's fail_reason,
the events), shown (the CLI's lines) or forwarded (the proxy's reply to an agent). Strings shorter than
MIN_SECRET_CHARS are not masked: they would shred ordinary text.

The endpoints here are real local HTTP servers on 127.0.0.1 (the sim's, told to fail; a bare one for
embeddings), reached through the real `openai` client.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from skillstate.cli.main import cli
from skillstate.envs.workspace.proxy.server import AgentProxy
from skillstate.envs.workspace.tasks import bundled_splits
from skillstate.llm.base import CallResult, FatalLLMError
from skillstate.log.values import CallRef
from skillstate.sim.server import Fault, SimServer
from skillstate.util import MIN_SECRET_CHARS, redact, register_secret

TARGET, OPTIMIZER = "sim-target", "sim-optimizer"


def azure_like_key() -> str:
    """A key of no pattern redaction knows (not sk-…, not a bearer token): 32 characters, fresh per test."""
    return "az0" + secrets.token_hex(16)[:29]


def quoting(key: str) -> str:
    """An endpoint's error body that quotes the key it was sent (as some gateways do)."""
    return json.dumps({"error": {"message": f"Access denied due to invalid subscription key {key}. Make sure "
                                            "to provide a valid key for an active subscription.",
                                 "type": "invalid_request_error"}})


# -- redact ----------------------------------------------------------------------------------------------

def test_redact_masks_a_registered_secret_of_any_shape_wherever_it_appears():
    key = azure_like_key()
    text = f"denied for {key}; url https://x/?k={key}; json {json.dumps({'k': key})}"
    assert key in redact(text)  # no pattern matches it: until it is registered, it is ordinary text
    register_secret(key)
    masked = redact(text)
    assert key not in masked and masked.count("***") == 3
    assert redact("nothing secret here") == "nothing secret here"


def test_short_strings_are_never_masked():
    """A key like `local` or `k` (any value for a server without auth) would shred every text it occurs in."""
    assert MIN_SECRET_CHARS == 8
    for short in ("k", "local", "ollama1"):
        register_secret(short)
        assert redact(f"the local endpoint said {short}") == f"the local endpoint said {short}"
    register_secret("")
    register_secret(None)
    assert redact("text") == "text"


def test_a_database_password_in_a_url_is_masked():
    for url in ("postgresql+psycopg://alice:s3cret-Pa55word@db.example:5432/runs",
                "mysql://root:hunter2hunter2@127.0.0.1/x"):
        masked = redact(f"cannot connect to {url}: refused")
        assert "s3cret" not in masked and "hunter2" not in masked and "***@" in masked


# -- the proxy's reply -----------------------------------------------------------------------------------

def test_the_proxy_masks_a_key_in_a_failed_calls_error():
    """Whatever a failed call's error says, the agent and the rollout's failure get it masked."""
    key = azure_like_key()
    register_secret(key)

    def complete(messages: list[dict[str, Any]], tools: Any = None) -> CallResult:
        error = f"HTTP 500 after 1 attempt: bad key {key}"
        return CallResult(ref=CallRef(request_hash="0" * 64, role="target", error=error), error=error)

    with AgentProxy(complete) as proxy:
        response = proxy.run_while(lambda: httpx.post(
            proxy.base_url + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {proxy.key}"}, timeout=10))
    assert response.status_code == 400 and "the model call failed" in response.text
    assert key not in response.text and key not in str(proxy.failure) and key not in json.dumps(proxy.exchanges)


# -- a run through the CLI -------------------------------------------------------------------------------

AGENT = """
import json, os, urllib.request, urllib.error
body = json.dumps({"model": "any", "messages": [{"role": "user", "content": "fix the project"}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                          "Content-Type": "application/json"})
try:
    print("REPLY", urllib.request.urlopen(request, timeout=60).read().decode())
except urllib.error.HTTPError as err:
    print("REPLY", err.code, err.read().decode())
"""


def tiny_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, items in bundled_splits(["train", "val", "test"]).items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items[:2]))
    return folder


def workspace_config(tmp_path: Path, check_tools: bool) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "env": "workspace", "data": str(tiny_data(tmp_path / "data")), "batch_size": 2, "num_epochs": 1,
        "max_stage_failure_share": 1.0,  # the run goes on with its failed rollouts: their events are written
        "target": {"max_retries": 0, "check_tools": check_tools}, "optimizer": {"max_retries": 0},
        "env_config": {"sandbox": {"kind": "none"},
                       "harness": {"kind": "command", "command": [sys.executable, "-c", AGENT], "wall_seconds": 60}},
    }))
    return path


@pytest.fixture
def leaky_server():
    """The sim world behind the OpenAI API, whose target calls fail with an error that quotes the key."""
    from skillstate.cli.tools import sim_world_named

    server = SimServer(sim_world_named("workspace", None))
    server.httpd.handle_error = lambda request, client_address: None
    with server:
        yield server


def trajectories(db: str) -> list[dict[str, Any]]:
    from skillstate.engine.loading import load_run
    from skillstate.storage.store import Store

    store = Store(db)
    try:
        return [json.loads(store.get_blob(result.trajectory)) for stored in load_run(store, "r").own
                for result in getattr(stored.event, "results", None) or [] if getattr(result, "trajectory", None)]
    finally:
        store.close()


def run(server: SimServer, key: str, db: str, config: Path, *extra: str):
    args = ["run", "--backend", "openai", "--target-model", TARGET, "--optimizer-model", OPTIMIZER,
            "--base-url", server.base_url, "--config", str(config), "--run-id", "r", "--db", db, *extra]
    return CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": key})


def test_a_key_an_endpoint_quotes_is_in_no_row_event_reply_or_line(leaky_server, tmp_path):
    """Every target call fails with an error quoting the run's key. The agent's reply from the proxy, the
    journal's rows, the events (the rollouts' fail_reason) and every line the CLI prints hold it masked."""
    key = azure_like_key()
    leaky_server.fault = lambda n, path, body: (Fault(status=500, body=quoting(key))
                                                if body.get("model") == TARGET else None)
    db_path = tmp_path / "runs.db"
    db = f"sqlite:///{db_path}"
    res = run(leaky_server, key, db, workspace_config(tmp_path, check_tools=False))
    shown = [res.output]
    for command in (["log", "r", "--json"], ["show", "r"], ["runs"]):
        out = CliRunner().invoke(cli, [*command, "--db", db], env={"OPENAI_API_KEY": key})
        shown.append(out.output)
    assert all(key not in text for text in shown), next(t for t in shown if key in t)

    import sqlite3

    with sqlite3.connect(db_path) as conn:
        errors = [row[0] for row in conn.execute("select error from llm_calls where error is not null")]
        reasons = [json.dumps(row) for row in conn.execute("select * from events")]
    assert errors and all("invalid subscription key ***" in e for e in errors), errors
    assert not any(key in r for r in reasons)
    for stored in (db_path, Path(f"{db_path}-wal")):  # the blobs too: trajectories, the agent's printed reply
        assert not stored.exists() or key.encode() not in stored.read_bytes()
    log = CliRunner().invoke(cli, ["log", "r", "--json", "--db", db]).output
    assert "rollout_error: HTTP 500 after 1 attempt: Access denied due to invalid subscription key ***" in log
    replies = [line for t in trajectories(db) for line in t["log"] if line.startswith("REPLY")]
    assert replies and all(line.startswith("REPLY 400") and "the model call failed" in line and "key ***" in line
                           for line in replies), replies  # what the proxy answered the agent


def test_a_key_quoted_in_the_start_up_check_is_masked_in_the_error_line(leaky_server, tmp_path):
    """The start-up check's refusal (one line, exit 2) quotes the endpoint's words: masked."""
    key = azure_like_key()
    leaky_server.fault = lambda n, path, body: Fault(status=401, body=quoting(key))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    res = run(leaky_server, key, db, workspace_config(tmp_path, check_tools=True))
    assert res.exit_code == 2, res.output
    assert "invalid subscription key ***" in res.output and key not in res.output


# -- embeddings ------------------------------------------------------------------------------------------

def test_an_embeddings_endpoint_quoting_the_key_is_masked(monkeypatch):
    """bank.embedder openai: the endpoint's refusal, which quotes the key, stops the run with it masked."""
    from skillstate.config import ModelConfig
    from skillstate.llm.embeddings import OpenAIEmbeddings

    key = azure_like_key()

    class Refuses(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = quoting(key).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("EMBED_KEY", key)
        cfg = ModelConfig(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key_env="EMBED_KEY",
                          max_retries=0)
        with pytest.raises(FatalLLMError) as err:
            OpenAIEmbeddings(cfg).embed("text-embedding-3-small", ["a text"])
    finally:
        server.shutdown()
        server.server_close()
    assert "invalid subscription key ***" in str(err.value) and key not in str(err.value)
