"""The LLM failure policy, end to end: `skillstate run --backend openai`
through the real `openai` client against a local server on 127.0.0.1 that
misbehaves as a `Fault` rule says.

- fatal (400, 401, 403, 404, 422, a reply that is not a chat completion):
  exit 2 at once, one line naming the endpoint, the status and the server's
  words, plus the resume hint;
- transient (5xx, 429, timeouts, dropped connections) and malformed bodies:
  retried by the client, then a failed call recorded with a precise error;
  the step degrades, and the circuit breaker stops the run (exit 4) when too
  many fail;
- an empty optimizer reply is a failed call, an empty target reply an answer;
- preflight: a bad key, a closed port or an unknown model is one line, exit
  2, and no run in the database.

A stopped run resumed against the healthy server ends with exactly the events
of a run that never failed, and no successful call is sent twice.
"""

from __future__ import annotations

import json
import shlex
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from skillstate.cli.main import cli
from skillstate.envs import load_dataset_dir
from skillstate.sim.server import Fault, SimServer
from skillstate.sim.world import SimWorld
from skillstate.storage.store import Store

ENV = {"OPENAI_API_KEY": "sk-failure-policy-test"}
RUN = "r"
TARGET, OPTIMIZER = "sim-target", "sim-optimizer"
NO_RETRIES = ("--set", "target.max_retries=0", "--set", "optimizer.max_retries=0")
CONCURRENCY = 8  # the default `concurrency`: at most this many calls are in flight when a fatal reply arrives


# --- the misbehaving server -------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    """The examples/qa world behind an OpenAI-compatible API, one per module so
    every run (failing or clean) records the same base_url in its config."""
    splits = load_dataset_dir(EXAMPLES / "qa", ["train", "val", "test"])
    srv = SimServer(SimWorld([i for items in splits.values() for i in items]))
    # A handler that wakes after its client gave up (a timeout) writes to a closed
    # socket; socketserver would print that traceback into whatever stderr is current.
    srv.httpd.handle_error = lambda request, client_address: None
    # Work around the sim server's listen backlog of 5 (below the client's 8 calls in flight, see
    # test_the_sim_server_queues_as_many_connections_as_the_client_opens): dropped SYNs cost a 1 s
    # retransmit each, which turns into spurious timeouts with target.timeout=0.5.
    srv.httpd.socket.listen(64)
    with srv:
        yield srv


@pytest.fixture
def sim(server):
    server.fault = None
    server.fail_first = 0
    server.requests = 0  # the rules below count chat requests from 1 in each test
    yield server
    server.fault = None


class Rule:
    """A fault rule that counts the faults it served (thread-safe: the server is threaded)."""

    def __init__(self, pick: Callable[[int, str, dict[str, Any]], Fault | None]):
        self.pick = pick
        self.lock = threading.Lock()
        self.served = 0
        self.seen: list[tuple[int, str, dict[str, Any]]] = []

    def __call__(self, n: int, path: str, body: dict[str, Any]) -> Fault | None:
        fault = self.pick(n, path, body)
        with self.lock:
            self.seen.append((n, path, body))
            if fault is not None:
                self.served += 1
        return fault


def error_body(message: str, kind: str = "invalid_request_error") -> str:
    return json.dumps({"error": {"message": message, "type": kind}})


def chat_body(content: str | None, finish_reason: str = "stop", prompt_tokens: int = 3, completion_tokens: int = 1,
              message: bool = True) -> str:
    """A chat completion's body; without `message`, its choice has none."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason}
    if message:
        choice["message"] = {"role": "assistant", "content": content}
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    return json.dumps({"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [choice], "usage": usage})


def is_chat(n: int) -> bool:
    return n > 0  # n is 0 for GETs (the preflight's /v1/models)


def model_of(body: dict[str, Any]) -> str | None:
    return body.get("model")


# --- driving the CLI ------------------------------------------------------------------


def invoke(args: list[str]):
    return CliRunner().invoke(cli, args, env=ENV)


def run_args(server: SimServer | str, db: str, *extra: str) -> list[str]:
    """`skillstate run` against `server` (or a base URL): examples/qa, batch 12, one epoch (3 steps). The
    faults here pick requests by their order, so no work is done ahead (it would interleave with the baseline's;
    test_work_ahead covers failures with it on)."""
    base_url = server if isinstance(server, str) else server.base_url
    return ["run", "--backend", "openai", "--target-model", TARGET, "--optimizer-model", OPTIMIZER,
            "--base-url", base_url, "--data", str(EXAMPLES / "qa"), "--batch-size", "12", "--epochs", "1",
            "--run-id", RUN, "--db", db, "--set", "overlap_start=false", *extra]


def db_url(tmp_path, name: str = "f") -> str:
    return f"sqlite:///{tmp_path / (name + '.db')}"


def error_line(res) -> str:
    """The one line a failed command ends with: `Error: ...`, and no traceback."""
    assert "Traceback" not in res.output, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # handled, not an uncaught exception
    lines = res.output.strip().splitlines()
    assert lines and lines[-1].startswith("Error: "), res.output
    assert sum(line.startswith("Error") for line in lines) == 1, res.output
    return lines[-1]


def events(db: str) -> list[tuple[str, Any]]:
    res = invoke(["log", RUN, "--json", "--db", db])
    assert res.exit_code == 0, res.output
    return [(e["type"], e["payload"]) for e in json.loads(res.output)]


def types(evs: list[tuple[str, Any]]) -> list[str]:
    return [t for t, _ in evs]


def calls(db: str):
    store = Store(db)
    try:
        return store.read_calls(RUN)
    finally:
        store.close()


def errors(db: str) -> Counter:
    return Counter((c.role, c.error) for c in calls(db) if c.error is not None)


def assert_audit(db: str) -> None:
    res = invoke(["audit", RUN, "--db", db])
    assert res.exit_code == 0, res.output
    assert "hash chain and invariants intact" in res.output


def assert_no_run(db: str) -> None:
    res = invoke(["runs", "--json", "--db", db])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == []
    store = Store(db)
    try:
        assert store.list_runs() == []
    finally:
        store.close()


@pytest.fixture(scope="module")
def clean_events(server, tmp_path_factory):
    """The events of a run that never failed, with the given extra arguments
    (same server, same run id, its own database); computed once per settings."""
    cache: dict[tuple[str, ...], list[tuple[str, Any]]] = {}

    def get(*extra: str) -> list[tuple[str, Any]]:
        if extra not in cache:
            saved, server.fault = server.fault, None
            requests = server.requests
            try:
                db = db_url(tmp_path_factory.mktemp("clean"), "clean")
                res = invoke(run_args(server, db, *extra))
                assert res.exit_code == 0, res.output
                cache[extra] = events(db)
            finally:
                server.fault, server.requests = saved, requests
        return cache[extra]

    return get


def assert_resumes_like_a_clean_run(server: SimServer, db: str, line: str, clean: list[tuple[str, Any]]) -> None:
    """The stopped log is a prefix of the clean one; the resume hint in `line`,
    run as printed against the healthy server, finishes the run with exactly
    the clean run's events, and no successful call was sent twice."""
    stopped = events(db)
    assert stopped == clean[: len(stopped)] and len(stopped) < len(clean)
    hint = line.rsplit("resume with: ", 1)[-1]
    argv = shlex.split(hint)
    assert argv == ["skillstate", "resume", RUN, "--db", db], hint
    server.fault = None
    res = invoke(argv[1:])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    resumed = events(db)
    assert types(resumed)[-1] == "RunCompleted"
    assert resumed == clean
    assert_audit(db)
    ok = Counter(c.request_hash for c in calls(db) if c.error is None)
    assert ok and set(ok.values()) == {1}, [h for h, k in ok.items() if k > 1]


# --- fatal errors: stop at once, exit 2, resumable ------------------------------------


FATAL_STATUSES = [
    # status, the role whose requests get it, from which chat request on, the server's message, the hint we add,
    # the events of the stopped run (None: some proper prefix beyond the baseline)
    pytest.param(400, TARGET, 21, "Unsupported parameter: 'max_tokens' is not supported with this model.", "",
                 ["RunStarted"], id="400-target-baseline"),
    pytest.param(401, OPTIMIZER, 1, "Incorrect API key provided: sk-fai***test.", " (check the API key)",
                 ["RunStarted", "BaselineEvaluated", "StepStarted", "RolloutCompleted"], id="401-optimizer-reflect"),
    pytest.param(403, OPTIMIZER, 1, "Project does not have access to model sim-optimizer",
                 " (check the API key's permissions)",
                 ["RunStarted", "BaselineEvaluated", "StepStarted", "RolloutCompleted"], id="403-optimizer-reflect"),
    pytest.param(404, TARGET, 61, "The model `sim-target` does not exist or you do not have access to it.",
                 " (check target.base_url and the model name 'sim-target')", None, id="404-target-mid-run"),
    pytest.param(422, TARGET, 41, "Input validation error: `temperature` must be strictly positive", "",
                 None, id="422-target-mid-run"),
]


@pytest.mark.parametrize("status, model, first, message, hint, stopped_types", FATAL_STATUSES)
def test_a_fatal_status_mid_run_stops_at_once_in_one_line_and_resumes(
        sim, tmp_path, clean_events, status, model, first, message, hint, stopped_types):
    role = "target" if model == TARGET else "optimizer"
    rule = Rule(lambda n, path, body: Fault(status, error_body(message))
                if n >= first and model_of(body) == model else None)
    sim.fault = rule
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert f"the {role} endpoint {sim.base_url}" in line
    assert f"answered HTTP {status}: {message}{hint}; " in line
    assert f"the run is saved: fix this, then resume with: skillstate resume {RUN} --db " in line
    assert 1 <= rule.served <= CONCURRENCY  # at once: only the calls already in flight got the error
    stopped = events(db)
    if stopped_types is not None:
        assert types(stopped) == stopped_types
    else:
        assert len(stopped) > 2 and types(stopped)[:2] == ["RunStarted", "BaselineEvaluated"]
    assert_audit(db)
    assert_resumes_like_a_clean_run(sim, db, line, clean_events(*NO_RETRIES))


NOT_A_CHAT_COMPLETION = [
    pytest.param(Fault(200, "<!doctype html><html><head><title>Welcome to nginx!</title></head></html>",
                       "text/html"),
                 "did not answer with a chat completion (text/html: '<!doctype html><html><head><title>Welcome",
                 id="html"),
    pytest.param(Fault(200, "Ollama is running", "text/plain"),
                 "did not answer with a chat completion (text/plain: 'Ollama is running')", id="plain-text"),
    pytest.param(Fault(200, json.dumps({"result": 1})),
                 "did not answer with a chat completion (no 'choices'; got result)", id="json-without-choices"),
]


@pytest.mark.parametrize("fault, what", NOT_A_CHAT_COMPLETION)
def test_a_reply_that_is_not_a_chat_completion_is_fatal(sim, tmp_path, clean_events, fault, what):
    rule = Rule(lambda n, path, body: fault if n > 20 else None)  # after the preflight, in the baseline
    sim.fault = rule
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert f"Error: the target endpoint {sim.base_url}" in line
    assert what in line
    assert f"resume with: skillstate resume {RUN} --db " in line
    assert 1 <= rule.served <= CONCURRENCY
    assert types(events(db)) == ["RunStarted"]  # the baseline was abandoned, not appended
    assert_audit(db)
    assert_resumes_like_a_clean_run(sim, db, line, clean_events(*NO_RETRIES))


# --- failed calls and the circuit breaker: exit 4, resumable ------------------------------


def test_http_500_on_every_call_trips_the_breaker_and_resumes(sim, tmp_path, clean_events):
    rule = Rule(lambda n, path, body: Fault(500, error_body("The server had an error while processing your request.",
                                                            "server_error")) if is_chat(n) else None)
    sim.fault = rule
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 4, res.output
    line = error_line(res)
    assert "Error: stopped: 16 LLM calls in a row failed (max_consecutive_failures=16) in stage baseline" in line
    assert "target: HTTP 500 after 1 attempt: The server had an error while processing your request." in line
    assert f"resume with: skillstate resume {RUN} --db " in line
    assert types(events(db)) == ["RunStarted"]
    failed = calls(db)
    assert 16 <= len(failed) <= 16 + CONCURRENCY  # nothing more is sent once the breaker opened
    assert {c.error for c in failed} == {
        "HTTP 500 after 1 attempt: The server had an error while processing your request."}
    assert rule.served == len(failed)
    assert_audit(db)
    assert_resumes_like_a_clean_run(sim, db, line, clean_events(*NO_RETRIES))


MALFORMED = [
    pytest.param('{"id": "chatcmpl-1", "choices": [{"index": 0, "message": {"role": "assis',
                 "malformed reply: truncated or invalid JSON (", id="truncated-json"),
    pytest.param(json.dumps({"choices": "x"}), "malformed reply: 'choices' is \"x\", not a list of choices",
                 id="choices-wrong-shape"),
    pytest.param("", "malformed reply: empty body", id="empty-body"),
    pytest.param(json.dumps({"choices": [{"message": "hi"}]}), 'malformed reply: choices[0].message is "hi"',
                 id="message-wrong-shape"),
]


@pytest.mark.parametrize("body, named", MALFORMED)
def test_a_malformed_body_is_a_failed_call_named_precisely(sim, tmp_path, clean_events, body, named):
    sim.fault = Rule(lambda n, path, b: Fault(200, body) if is_chat(n) else None)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 4, res.output
    line = error_line(res)
    assert "16 LLM calls in a row failed (max_consecutive_failures=16)" in line
    assert f"the last: target: {named}" in line
    recorded = errors(db)
    assert recorded and all(role == "target" and error.startswith(named) for role, error in recorded)
    assert types(events(db)) == ["RunStarted"]
    assert_audit(db)
    assert_resumes_like_a_clean_run(sim, db, line, clean_events(*NO_RETRIES))


def test_a_hang_past_the_timeout_is_a_failed_call_naming_the_timeout_key(sim, tmp_path, clean_events):
    # 2 s, not less: the clean run and the resume are held to the same timeout, and a loaded CI machine
    # can take more than 0.5 s to answer a healthy request
    extra = ("--set", "target.timeout=2", "--set", "target.max_retries=0", "--set", "optimizer.max_retries=0")
    sim.fault = Rule(lambda n, path, body: Fault(delay=6) if is_chat(n) and model_of(body) == TARGET else None)
    db = db_url(tmp_path)
    start = time.monotonic()
    res = invoke(run_args(sim, db, *extra))
    assert res.exit_code == 4, res.output
    line = error_line(res)
    expected = "timed out after 2 s (1 attempt); a slow server needs a larger target.timeout"
    assert "max_consecutive_failures=16" in line and expected in line
    assert set(errors(db)) == {("target", expected)}
    assert time.monotonic() - start < 30  # it gave up after 2 s a call, it did not wait for the server
    assert types(events(db)) == ["RunStarted"]
    assert_audit(db)
    assert_resumes_like_a_clean_run(sim, db, line, clean_events(*extra))


def test_a_dropped_connection_is_a_failed_call_and_the_stage_share_rule_stops_the_run(sim, tmp_path, clean_events):
    # the baseline's 24 requests are answered; every request after it is dropped unanswered
    sim.fault = Rule(lambda n, path, body: Fault(drop=True) if n > 24 else None)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 4, res.output
    line = error_line(res)
    assert ("Error: stopped: 12 of the 12 LLM calls of stage rollout failed "
            "(more than max_stage_failure_share=0.5; most common") in line
    assert "target: the server closed the connection without a reply (" in line
    recorded = errors(db)
    assert recorded and all(error.startswith("the server closed the connection without a reply (")
                            and error.endswith("; 1 attempt)") for _, error in recorded)
    # the rollout was abandoned: the log ends after the baseline and the step's start
    assert types(events(db)) == ["RunStarted", "BaselineEvaluated", "StepStarted"]
    assert_audit(db)
    assert_resumes_like_a_clean_run(sim, db, line, clean_events(*NO_RETRIES))


# --- transient errors the client retries: the run completes ---------------------------------


def test_http_500_on_30_percent_of_requests_is_retried_and_the_run_completes(sim, tmp_path):
    # Retry-After keeps the client's backoff short (it honours it for any retried status); without it this
    # run spends ~10 s sleeping between retries.
    rule = Rule(lambda n, path, body: Fault(500, error_body("flaky", "server_error"), headers={"Retry-After": "0.05"})
                if n % 10 < 3 and is_chat(n) else None)
    sim.fault = rule
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, "--set", "target.max_retries=2", "--set", "optimizer.max_retries=2"))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and "Error" not in res.output
    assert rule.served >= 30  # the server really failed ~30% of what it was sent
    assert types(events(db))[-1] == "RunCompleted"
    recorded = calls(db)
    failed = [c for c in recorded if c.error is not None]
    # a call fails only when all 3 attempts hit a 500 (~3%): a few at most, each named precisely
    assert {c.error for c in failed} <= {"HTTP 500 after 3 attempts: flaky"}
    assert len(failed) <= len(recorded) // 10
    assert_audit(db)


def test_429_is_retried_honouring_retry_after_and_the_run_completes(sim, tmp_path, clean_events):
    extra = ("--set", "target.max_retries=1", "--set", "optimizer.max_retries=1")
    throttled: dict[str, list[float]] = {}  # request body -> when each attempt arrived
    models: set[str] = set()
    targets = [0]  # target requests throttled so far
    lock = threading.Lock()

    def pick(n, path, body):
        if not is_chat(n):
            return None
        key = json.dumps(body, sort_keys=True)
        with lock:
            if key in throttled:
                throttled[key].append(time.monotonic())
                return None
            # a fresh target request from n=5 on, another from n=30 on (a retry has a key seen before),
            # and the first optimizer request
            target_due = model_of(body) == TARGET and n >= (5, 30, 10**9)[targets[0]]
            if target_due or (model_of(body) == OPTIMIZER and OPTIMIZER not in models):
                models.add(model_of(body))
                targets[0] += model_of(body) == TARGET
                throttled[key] = [time.monotonic()]
                return Fault(429, error_body("Rate limit reached for requests", "requests"),
                             headers={"Retry-After": "1"})
        return None

    sim.fault = Rule(pick)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *extra))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert len(throttled) == 3
    for attempts in throttled.values():
        assert len(attempts) == 2  # the 429, then one retry that was answered
        assert attempts[1] - attempts[0] >= 0.95  # Retry-After: 1 honoured (the client's own backoff is <= 0.5 s)
    assert not errors(db)
    assert events(db) == clean_events(*extra)  # a rate limit the client absorbed changes nothing
    assert_audit(db)


def test_failed_calls_degrade_the_step_rollout_errors_and_merge_fallbacks(sim, tmp_path):
    def pick(n, path, body):
        if 25 <= n <= 28:  # 4 of the 12 rollout calls of step 1 (the baseline is requests 1-24)
            return Fault(503, error_body("overloaded", "server_error"))
        if model_of(body) == OPTIMIZER and "# Task: merge" in json.dumps(body.get("messages")):
            return Fault(503, error_body("overloaded", "server_error"))
        return None

    sim.fault = Rule(pick)
    db = db_url(tmp_path)
    # minibatches of 2: which items the 4 faults hit depends on thread timing, and with larger minibatches a side
    # could end with one patch and so no merge call
    res = invoke(run_args(sim, db, *NO_RETRIES, "--set", "minibatch_size=2"))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    evs = events(db)
    assert types(evs)[-1] == "RunCompleted"
    first_rollout = next(p for t, p in evs if t == "RolloutCompleted")
    reasons = [r["fail_reason"] for r in first_rollout["results"]]
    assert reasons.count("rollout_error: HTTP 503 after 1 attempt: overloaded") == 4
    broken = [r for r in first_rollout["results"] if r["fail_reason"].startswith("rollout_error")]
    assert all(r["call"]["error"] == "HTTP 503 after 1 attempt: overloaded" and r["hard"] == 0.0 for r in broken)
    merges = [m for t, p in evs if t == "PatchesMerged" for m in p["merges"]]
    assert merges and all(m["status"] == "fallback" for m in merges)
    assert all(m["call"]["error"] == "HTTP 503 after 1 attempt: overloaded" for m in merges)
    recorded = errors(db)
    assert recorded[("target", "HTTP 503 after 1 attempt: overloaded")] == 4
    assert recorded[("optimizer", "HTTP 503 after 1 attempt: overloaded")] == len(merges)
    assert_audit(db)


# --- empty replies ----------------------------------------------------------------------------


def test_an_empty_target_reply_is_an_answer_not_a_failed_call(sim, tmp_path):
    sim.fault = Rule(lambda n, path, body: Fault(200, chat_body("")) if model_of(body) == TARGET else None)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    evs = events(db)
    assert types(evs)[-1] == "RunCompleted"
    results = [r for t, p in evs if t == "RolloutCompleted" for r in p["results"]]
    assert results and all(r["prediction"] == "" and r["fail_reason"] == "empty_answer" and r["call"]["error"] is None
                           for r in results)
    assert not errors(db)  # every target call succeeded: its answer was just wrong
    assert_audit(db)


@pytest.mark.parametrize("content, finish_reason, named", [
    pytest.param("", "stop", "empty reply", id="empty"),
    pytest.param("   \n", "stop", "empty reply", id="whitespace"),
    pytest.param('{"edits": [{"op": "add", "con', "length", "reply truncated at max_tokens=", id="cut-off"),
])
def test_an_unusable_optimizer_reply_is_a_failed_call(sim, tmp_path, content, finish_reason, named):
    done = threading.Event()

    def pick(n, path, body):  # the first optimizer request only: the step degrades, the run goes on
        if model_of(body) == OPTIMIZER and not done.is_set():
            done.set()
            return Fault(200, chat_body(content, finish_reason))
        return None

    sim.fault = Rule(pick)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    recorded = errors(db)
    assert list(recorded.values()) == [1]
    (role, error), = recorded
    assert role == "optimizer" and error.startswith(named)
    evs = events(db)
    assert types(evs)[-1] == "RunCompleted"
    bad = [p for t, p in evs if t == "PatchProposed" and p["status"] == "error"]
    assert len(bad) == 1 and bad[0]["call"]["error"] == error and bad[0]["edits"] == []
    assert_audit(db)


# --- preflight: no run is created ----------------------------------------------------------------


def test_preflight_bad_key_is_one_line_and_leaves_no_run(sim, tmp_path):
    rule = Rule(lambda n, path, body: Fault(401, error_body("Incorrect API key provided: sk-fai***test."))
                if not is_chat(n) else None)
    sim.fault = rule
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db))
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert line == (f"Error: the target endpoint {sim.base_url}/ answered HTTP 401: Incorrect API key provided: "
                    "sk-fai***test. (check the API key); no run was created")
    assert [path for n, path, _ in rule.seen] == ["/v1/models"]  # nothing else was asked
    assert_no_run(db)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_preflight_closed_port_is_one_line_and_leaves_no_run(tmp_path):
    port = closed_port()
    db = db_url(tmp_path)
    res = invoke(run_args(f"http://127.0.0.1:{port}/v1", db))
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert line.startswith(f"Error: cannot reach the target endpoint http://127.0.0.1:{port}/v1/ (")
    assert line.endswith("; no run was created")
    assert_no_run(db)


def test_preflight_unknown_model_is_one_line_and_leaves_no_run(sim, tmp_path):
    others = json.dumps({"object": "list", "data": [{"id": "llama3", "object": "model"},
                                                    {"id": "qwen2.5", "object": "model"}]})
    message = "The model `sim-target` does not exist or you do not have access to it."
    rule = Rule(lambda n, path, body: Fault(200, others) if not is_chat(n) else Fault(404, error_body(message)))
    sim.fault = rule
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db))
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert line == (f"Error: the target endpoint {sim.base_url}/ answered HTTP 404: {message} "
                    "(check target.base_url and the model name 'sim-target'); no run was created")
    probes = [body for n, _, body in rule.seen if is_chat(n)]
    assert len(probes) == 1  # one probe, not retried: a 404 is fatal
    assert probes[0]["model"] == TARGET and probes[0]["max_tokens"] == 1
    assert_no_run(db)


# --- the product bugs these tests found (see the report) ----------------------------------------


def test_preflight_names_the_attempts_it_made(tmp_path):
    """The preflight's GET /v1/models is sent with max_retries=0, so one
    attempt: the line must not claim the configured max_retries + 1."""
    port = closed_port()
    db = db_url(tmp_path)
    res = invoke(run_args(f"http://127.0.0.1:{port}/v1", db))  # the default max_retries, 4
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert "; 1 attempt)" in line, line
    assert_no_run(db)


def test_preflight_hang_is_named_a_timeout_not_a_dropped_connection(sim, tmp_path):
    sim.fault = Rule(lambda n, path, body: Fault(delay=1.5) if not is_chat(n) else None)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, "--set", "target.timeout=0.5"))
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert line.endswith("; no run was created")
    assert_no_run(db)
    assert "dropped the connection" not in line, line
    assert "timed out after 0.5 s" in line and "target.timeout" in line, line


def test_a_status_the_client_does_not_retry_reports_one_attempt(sim, monkeypatch):
    """413 (or 402, or a 429 whose Retry-After exceeds the client's cap) is
    not retried by the openai client: one attempt, whatever max_retries says."""
    from skillstate.config import ModelConfig
    from skillstate.llm.base import CallFailed, ChatRequest
    from skillstate.llm.openai_backend import OpenAIBackend

    monkeypatch.setenv("SKILLSTATE_FP_KEY", "k")
    rule = Rule(lambda n, path, body: Fault(413, error_body("Request too large")) if is_chat(n) else None)
    sim.fault = rule
    backend = OpenAIBackend(ModelConfig(base_url=sim.base_url, max_retries=2, timeout=5,
                                        api_key_env="SKILLSTATE_FP_KEY"), "target")
    request = ChatRequest.build("openai", TARGET, [{"role": "user", "content": "Question: What is 2 + 2?"}], 0.0, 16)
    with pytest.raises(CallFailed) as err:
        backend.complete(request)
    assert rule.served == 1  # the client sent it once
    assert str(err.value) == "HTTP 413 (not retried): Request too large"


def test_a_dead_optimizer_endpoint_trips_the_breaker(sim, tmp_path):
    """Every optimizer call fails: the run must stop (exit 4, resumable), not
    complete as if it had trained (health.py: "a dead or misbehaving endpoint
    never yields a run that merely looks finished")."""
    sim.fault = Rule(lambda n, path, body: Fault(500, error_body("optimizer down", "server_error"))
                     if model_of(body) == OPTIMIZER else None)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    ok = [c for c in calls(db) if c.role == "optimizer" and c.error is None]
    assert not ok  # not one optimizer call succeeded ...
    assert res.exit_code == 4, res.output[-600:]  # ... so the run must not end as "completed"
    assert "optimizer: HTTP 500 after 1 attempt: optimizer down" in error_line(res)


def test_the_sim_server_queues_as_many_connections_as_the_client_opens():
    """SimServer listens with socketserver's default backlog (5), below the
    default concurrency (8): under load the kernel drops the extra SYNs and
    each such call stalls ~1 s (the SYN retransmit), or times out with a short
    timeout. Nothing accepts here, so only the listen queue holds connections."""
    from skillstate.config import SkillConfig

    server = SimServer(SimWorld([]))  # not started: the connections wait in the listen queue
    sockets = []
    try:
        queued = 0
        for _ in range(SkillConfig().concurrency):
            s = socket.socket()
            sockets.append(s)
            s.settimeout(0.3)
            try:
                s.connect(server.httpd.server_address)
                queued += 1
            except OSError:  # TimeoutError: the SYN was dropped
                pass
        assert queued == SkillConfig().concurrency
    finally:
        for s in sockets:
            s.close()
        server.stop()
