"""Failures that must not look like successes (issue 20, section 3), end to
end through the real `openai` client against a local server on 127.0.0.1
(the misbehaving sim server of test_failure_policy):

1. `eval` whose every reply is a 200 without `message`, or with `content:
   null`, fails as `run` would (failed calls, the breaker, exit 4);
2. the start-up check refuses a models list that is an HTML page or an empty
   200, and one that never comes, in one line and seconds;
3. a tool environment against a server without tool calling is refused
   before the run exists, naming the fix; calls that failed in the stage a
   run stopped in are called failed, not unused;
4. the circuit breaker's calls in a row span the lanes and the stages;
5. a failed call that got a reply counts its tokens in the tables as in the
   budget;
6. a tool run whose target never called a tool, or wrote calls as text, says
   so in its summary and in `show`.
"""

from __future__ import annotations

import json
import time

import pytest
import test_failure_policy
from conftest import EXAMPLES
from test_failure_policy import (
    NO_RETRIES,
    OPTIMIZER,
    RUN,
    TARGET,
    Fault,
    Rule,
    assert_no_run,
    chat_body,
    db_url,
    error_body,
    error_line,
    invoke,
    is_chat,
    model_of,
    run_args,
)

from skillstate.cli.tools import sim_world_named
from skillstate.llm.base import CircuitOpen
from skillstate.llm.health import AheadHealth, CallHealth
from skillstate.reading.tool_use import PROBE_TOOL
from skillstate.sim.server import SimServer

server, sim = test_failure_policy.server, test_failure_policy.sim  # the misbehaving server's fixtures


def sql_args(base_url: str, db: str, *extra: str) -> list[str]:
    return ["run", "--backend", "openai", "--model", "sim", "--base-url", base_url, "--env", "sql", "--epochs", "1",
            "--batch-size", "12", "--set", "minibatch_size=4", "--set", "episode.max_turns=4",
            "--run-id", RUN, "--db", db, *extra]


def probe(body) -> bool:
    return any(t.get("function", {}).get("name") == PROBE_TOOL for t in body.get("tools") or [])


# --- 1. eval follows the failure policy of run -----------------------------------------------


@pytest.mark.parametrize("reply, named", [
    pytest.param(chat_body(None, message=False), "malformed reply: choices[0] has no 'message'", id="no-message"),
    pytest.param(chat_body(None), "malformed reply: choices[0].message has content null and no tool_calls",
                 id="content-null"),
])
def test_an_eval_whose_replies_have_no_answer_fails_like_a_run(sim, tmp_path, reply, named):
    sim.fault = Rule(lambda n, path, body: Fault(200, reply) if is_chat(n) else None)
    skill = tmp_path / "skill.md"
    skill.write_text("# Answering\n\n- Answer with the value only.\n", encoding="utf-8")
    db = db_url(tmp_path)
    res = invoke(["eval", "--skill", str(skill), "--backend", "openai", "--model", TARGET, "--base-url",
                  sim.base_url, "--data", str(EXAMPLES / "qa"), "--run-id", RUN, "--db", db,
                  "-q", *NO_RETRIES[:2]])
    assert res.exit_code == 4, res.output
    line = error_line(res)
    assert "evaluated" not in res.output
    assert line.startswith("Error: stopped: ") and named in line, line
    assert line.endswith(f"resume with: skillstate resume {RUN} --db {db}")


# --- 2. the start-up check: one line, in seconds ------------------------------------------------


@pytest.mark.parametrize("fault, named", [
    pytest.param(Fault(200, "<!doctype html><html><body>Open WebUI</body></html>", "text/html"),
                 "answered its models list (GET models) with text/html: '<!doctype html>", id="html"),
    pytest.param(Fault(200, "", "application/json"), "answered its models list (GET models) with an empty body",
                 id="empty-200"),
    pytest.param(Fault(delay=3), "did not answer its models list in time (timed out after 0.5 s, 1 attempt; "
                                 "the start-up check waits 0.5 s for it", id="never-answers"),
])
def test_the_start_up_check_refuses_a_models_list_that_is_no_list_in_one_line(sim, tmp_path, monkeypatch, fault,
                                                                               named):
    import skillstate.llm.endpoint_check as check

    monkeypatch.setattr(check, "CHECK_TIMEOUT", 0.5)  # the default target.timeout (600 s) stays as it is
    sim.fault = Rule(lambda n, path, body: fault if not is_chat(n) else None)
    db = db_url(tmp_path)
    start = time.monotonic()
    res = invoke(run_args(sim, db))
    assert time.monotonic() - start < 2.5  # refused before the server's 3 s delay ends
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert line.startswith(f"Error: the target endpoint {sim.base_url}/ {named}"), line
    assert line.endswith("; no run was created")
    assert_no_run(db)


# --- 3. tool calling, checked up front; failed calls are called failed -------------------------------


@pytest.mark.parametrize("fault, named", [
    pytest.param(Fault(500, error_body("tools param requires --jinja flag", "server_error")),
                 "a request with tools failed: HTTP 500 after 3 attempts: tools param requires --jinja flag",
                 id="error"),
    pytest.param(Fault(400, error_body("tools param requires --jinja flag")),
                 "a request with tools failed: answered HTTP 400: tools param requires --jinja flag", id="400"),
    pytest.param(Fault(200, chat_body(json.dumps({"name": PROBE_TOOL, "arguments": {}}))),
                 f"the model wrote a tool call as text: '{{\"name\": \"{PROBE_TOOL}\"", id="call-as-text"),
    pytest.param(Fault(200, chat_body("pong")), "the model answered without calling it: 'pong'", id="ignored"),
])
def test_a_tool_env_against_a_server_without_tool_calling_is_refused_before_the_run_exists(
        sim, tmp_path, fault, named):
    rule = Rule(lambda n, path, body: fault if is_chat(n) and body.get("tools") else None)
    sim.fault = rule
    db = db_url(tmp_path)
    res = invoke(sql_args(sim.base_url, db))
    assert res.exit_code == 2, res.output
    line = error_line(res)
    assert line.startswith(f"Error: the target endpoint {sim.base_url}/ does not do tool calling ("), line
    assert named in line, line
    assert "env sql calls tools" in line and "llama-server --jinja" in line
    assert line.endswith("; no run was created")
    assert_no_run(db)
    assert all(probe(body) for n, _, body in rule.seen if is_chat(n) and body.get("tools"))  # only the check's


def test_a_model_that_would_not_call_the_test_tool_runs_when_the_check_is_turned_off(sim, tmp_path):
    """The refusal names target.check_tools=false; with it the run goes ahead and its summary says that no
    tool was called (a model that can call tools may still ignore one test request)."""
    sim.fault = Rule(lambda n, path, body: Fault(200, chat_body("pong")) if is_chat(n) and body.get("tools")
                     else None)
    db = db_url(tmp_path)
    refused = invoke(sql_args(sim.base_url, db))
    assert refused.exit_code == 2 and "set target.check_tools=false to run anyway" in error_line(refused)
    res = invoke(sql_args(sim.base_url, db, "--set", "target.check_tools=false"))
    assert res.exit_code == 0, res.output
    assert "warning: no tool was called in" in " ".join(res.output.split())


def test_calls_that_failed_in_the_stage_a_run_stopped_in_are_called_failed_not_unused(sim, tmp_path):
    sim.fault = Rule(lambda n, path, body: Fault(500, error_body("boom", "server_error"))
                     if is_chat(n) and model_of(body) == TARGET and n > 12 else None)
    db = db_url(tmp_path)
    res = invoke(run_args(sim, db, *NO_RETRIES))
    assert res.exit_code == 4, res.output
    shown = invoke(["show", RUN, "--db", db])
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.output.split())
    assert "went unused" not in flat and "early reject" not in flat
    assert "sent calls failed outside the recorded stages (in the stage the run stopped in" in flat
    usage = json.loads(invoke(["show", RUN, "--db", db, "--json"]).output)["usage"]["target"]
    assert usage["unused"] == 0 and usage["failed_unrecorded"] >= 1


# --- 4. the breaker's row spans lanes and stages -----------------------------------------------------


def test_the_breaker_counts_failures_in_a_row_across_the_lanes_and_the_stages():
    run = CallHealth(max_consecutive=16, max_share=1.0)
    ahead = AheadHealth(run)  # the lane of work done ahead (runner.build_context)
    run.begin_stage("evaluate")
    for _ in range(7):  # 14 in a row, split between the lanes
        run.record("target", "HTTP 500 after 1 attempt: boom")
        ahead.record("target", "HTTP 500 after 1 attempt: boom")
    run.begin_stage("gate")  # a new stage does not wipe them
    ahead.record("target", "HTTP 500 after 1 attempt: boom")
    with pytest.raises(CircuitOpen, match="16 LLM calls in a row failed .* in stage gate"):
        run.record("target", "HTTP 500 after 1 attempt: boom")
    fresh = CallHealth(max_consecutive=3, max_share=1.0)
    AheadHealth(fresh).record("target", "boom")
    fresh.begin_stage("rollout")
    fresh.record("target", None)  # a success breaks the row, in any lane
    AheadHealth(fresh).record("target", "boom")
    fresh.record("target", "boom")
    with pytest.raises(CircuitOpen, match="3 LLM calls in a row failed"):
        AheadHealth(fresh).record("target", "boom")


# --- 5. one source of truth for tokens ---------------------------------------------------------------


def test_a_failed_call_that_got_a_reply_counts_its_tokens_in_the_tables_as_in_the_budget(sim, tmp_path):
    cut = chat_body('{"edits": [{"op": "add", "con', "length", prompt_tokens=1236, completion_tokens=1024)
    first = []

    def pick(n, path, body):  # the first optimizer request: a reply cut off at max_tokens, a failed call
        if model_of(body) == OPTIMIZER and not first:
            first.append(n)
            return Fault(200, cut)
        return None

    sim.fault = Rule(pick)
    db = db_url(tmp_path)
    prices = json.dumps({TARGET: [1.0, 2.0], OPTIMIZER: [3.0, 4.0]})
    res = invoke(run_args(sim, db, *NO_RETRIES, "--set", f"prices={prices}", "-q"))
    assert res.exit_code == 0, res.output
    s = json.loads(invoke(["show", RUN, "--db", db, "--json"]).output)
    assert s["failures"]["failed"] == 1
    optimizer = s["usage"]["optimizer"]
    assert optimizer["prompt_tokens"] == optimizer["sent_prompt_tokens"]  # nothing served: all sent, all counted
    assert optimizer["completion_tokens"] == optimizer["sent_completion_tokens"]
    assert s["cost"]["by_role"]["optimizer"] == pytest.approx(s["cost"]["paid_by_role"]["optimizer"])
    reflect = s["usage_by_stage"]["reflect"]["optimizer"]
    assert reflect["prompt_tokens"] >= 1236 and reflect["completion_tokens"] >= 1024


# --- 6. a tool run that never called a tool ------------------------------------------------------------


def test_a_tool_run_whose_target_writes_calls_as_text_says_so_in_its_summary_and_in_show(tmp_path):
    as_text = chat_body(json.dumps({"name": "sql", "arguments": {"query": "SELECT COUNT(*) FROM users"}}))
    with SimServer(sim_world_named("sql", None)) as srv:
        # a model that knows of the tools but writes its calls as text: the start-up check passes
        srv.fault = lambda n, path, body: (Fault(200, as_text) if is_chat(n) and body.get("tools")
                                              and not probe(body) else None)
        db = db_url(tmp_path)
        res = invoke(sql_args(srv.base_url, db, "-q", "--set", "target.max_retries=0"))
    assert res.exit_code == 0, res.output
    expected = ("warning: no tool was called in", "wrote a tool call as text")
    for text in (res.output, invoke(["show", RUN, "--db", db]).output):
        flat = " ".join(text.split())
        assert all(words in flat for words in expected), text
        assert "llama-server --jinja" in flat
    use = json.loads(invoke(["show", RUN, "--db", db, "--json"]).output)["tool_use"]
    assert use["replies"] > 0 and use["tool_calls"] == 0 and use["text_tool_calls"] == use["replies"]


def test_a_tool_run_that_calls_tools_says_nothing_of_it(tmp_path):
    with SimServer(sim_world_named("sql", None)) as srv:
        db = db_url(tmp_path)
        res = invoke(sql_args(srv.base_url, db, "-q", "--set", "target.max_retries=0"))
    assert res.exit_code == 0, res.output
    assert "tool call" not in res.output and "no tool was called" not in res.output
    use = json.loads(invoke(["show", RUN, "--db", db, "--json"]).output)["tool_use"]
    assert use["tool_calls"] > 0 and use["text_tool_calls"] == 0
