"""The LLM layer's failure policy in isolation (body parsing, unusable
replies, the circuit breaker, structured output), the failed-call summary,
storage errors mid-run, and keyed audit with a recorded head."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, scripted_factory, small_config
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from skillstate.cli.main import cli
from skillstate.errors import LLMStop, StorageStop
from skillstate.llm.base import CallFailed, ChatResponse, CircuitOpen, FatalLLMError
from skillstate.llm.health import CallHealth
from skillstate.llm.openai_backend import parse_chat_body
from skillstate.storage.store import AUDIT_KEY_ENV, Store, event_hash, events
from skillstate.trainer import Trainer


def _fatal(what: str) -> FatalLLMError:
    return FatalLLMError(f"the endpoint {what}")


def _completion(content, finish="stop", **extra) -> str:
    return json.dumps({"choices": [{"index": 0, "finish_reason": finish,
                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": 7, "completion_tokens": 3}, **extra})


# --- parsing a 200 body ------------------------------------------------------


def test_a_chat_completion_parses_with_usage_and_finish_reason():
    resp = parse_chat_body(_completion("hi", "length"), "application/json", _fatal)
    assert resp == ChatResponse("hi", 7, 3, "length")
    assert parse_chat_body(_completion(""), "application/json", _fatal).text == ""  # an empty answer is an answer


@pytest.mark.parametrize("body,kind,words", [
    ("", CallFailed, "empty body"),
    ("   \n", CallFailed, "empty body"),
    (_completion("hi")[:25], CallFailed, "truncated or invalid JSON"),
    ('{"choices": "x"}', CallFailed, "'choices' is"),
    ('{"choices": []}', CallFailed, "'choices' is []"),
    ('{"choices": [{"message": "text"}]}', CallFailed, "choices[0].message"),
    ('{"choices": [{"message": {"content": 5}}]}', CallFailed, "choices[0].message"),
    ("<html><body>Bad gateway</body></html>", FatalLLMError, "did not answer with a chat completion"),
    ("upstream connect error", FatalLLMError, "is base_url the server's OpenAI-compatible /v1 address?"),
    ('{"result": 1}', FatalLLMError, "no 'choices'; got result"),
    ("[1, 2]", FatalLLMError, "no 'choices'; got list"),
])
def test_malformed_bodies_fail_the_call_and_foreign_ones_are_fatal(body, kind, words):
    with pytest.raises(kind) as info:
        parse_chat_body(body, "text/html" if body.startswith("<") else "application/json", _fatal)
    assert words in str(info.value)


@given(st.text(max_size=200))
def test_any_body_parses_or_raises_one_of_the_two_errors(body):
    try:
        parse_chat_body(body, "application/json", _fatal)
    except (CallFailed, FatalLLMError):
        pass


# --- the circuit breaker ---------------------------------------------------------


def test_the_breaker_trips_on_n_failures_in_a_row_and_a_success_or_a_served_call_breaks_the_row():
    health = CallHealth(max_consecutive=3, max_share=1.0)
    health.begin_stage("rollout")
    health.record("target", "HTTP 500")
    health.record("target", "HTTP 500")
    health.served("target")
    health.record("target", "HTTP 500")
    health.record("target", None)
    health.record("target", "HTTP 500")
    health.record("target", "HTTP 500")
    with pytest.raises(CircuitOpen, match="3 LLM calls in a row failed .* stage rollout; the last: target: HTTP 500"):
        health.record("target", "HTTP 500")
    with pytest.raises(CircuitOpen):  # once open, nothing more is sent
        health.check()


@given(st.lists(st.booleans(), max_size=40), st.sampled_from([0.25, 0.5, 0.75]))
def test_the_share_rules_trip_exactly_when_more_than_the_share_failed(outcomes, share):
    health = CallHealth(max_consecutive=0, max_share=share)
    health.begin_stage("gate")
    for failed in outcomes:
        health.record("target", "boom" if failed else None)
    failed = sum(outcomes)
    stage_rule = len(outcomes) >= 4 and failed > share * len(outcomes)
    role_rule = failed >= 2 and failed > share * len(outcomes)
    if stage_rule:
        with pytest.raises(CircuitOpen, match=f"{failed} of the {len(outcomes)} LLM calls of stage gate failed"):
            health.end_stage()
    elif role_rule:
        with pytest.raises(CircuitOpen, match=f"{failed} of the {len(outcomes)} target calls so far failed"):
            health.end_stage()
    else:
        health.end_stage()


def test_a_role_that_only_ever_fails_trips_the_breaker_across_stages():
    health = CallHealth(max_consecutive=16, max_share=0.5)
    health.begin_stage("rollout")
    for _ in range(12):
        health.record("target", None)
    health.end_stage()
    health.begin_stage("reflect")
    health.record("optimizer", "HTTP 500 after 5 attempts: boom")
    health.end_stage()  # one failure is not yet a pattern
    health.begin_stage("aggregate")
    health.record("optimizer", "HTTP 500 after 5 attempts: boom")
    with pytest.raises(CircuitOpen, match="2 of the 2 optimizer calls so far failed, by the end of stage aggregate"):
        health.end_stage()


# --- unusable replies and the summary -----------------------------------------


class ReplyWith:
    """A backend whose optimizer replies come with a given finish reason, or empty."""

    name = "sim"

    def __init__(self, inner, finish=None, empty=False):
        self.inner, self.finish, self.empty = inner, finish, empty

    def complete(self, request):
        resp = self.inner.complete(request)
        if "<skill>" not in request.messages[-1][1]:
            return resp
        text = "" if self.empty else resp.text
        return ChatResponse(text, resp.prompt_tokens, resp.completion_tokens, self.finish or resp.finish_reason)


def _factory(**kw):
    base = scripted_factory()
    return lambda config, env, role: ReplyWith(base(config, env, role), **kw)


@pytest.mark.parametrize("kw,error", [
    ({"finish": "length"}, "reply truncated at max_tokens=4096 (finish_reason length); raise optimizer.max_tokens"),
    ({"empty": True}, "empty reply"),
])
def test_truncated_or_empty_optimizer_replies_are_failed_calls_that_stop_the_run(tmp_path, kw, error):
    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    with pytest.raises(LLMStop) as info:
        Trainer(small_config(num_epochs=1), store=store, run_id="u", backend_factory=_factory(**kw)).train()
    assert not info.value.fatal and "stage reflect" in str(info.value) and error in str(info.value)
    failed = [c for c in store.read_calls("u") if c.error]
    assert failed and {c.role for c in failed} == {"optimizer"} and all(c.error == error for c in failed)
    assert [s.type for s in store.read_events("u")][-1] == "RolloutCompleted"  # the reflect stage was not appended
    store.close()


def test_the_summary_counts_failed_calls_per_stage_and_role_and_its_last_line_says_so(tmp_path):
    def flaky(messages):
        if "letter" in messages[-1]["content"]:
            raise ValueError("upstream exploded")
        return "42"

    db = f"sqlite:///{tmp_path / 'f.db'}"
    result = Trainer(small_config(num_epochs=1), db=db, run_id="f",
                     backend_factory=scripted_factory(target=flaky)).train()
    failures = result.summary["failures"]
    assert failures["failed"] > 0 and set(failures["by_stage"]) >= {"baseline", "rollout", "test"}
    baseline = failures["by_stage"]["baseline"]["target"]
    assert baseline["common"] == "ValueError: upstream exploded" and baseline["failed"] == baseline["common_count"]
    from skillstate.cli.render import summary_text

    line = f"run f completed with {failures['failed']} failed LLM calls of {failures['calls']}"
    assert summary_text(result.summary).splitlines()[-1].startswith(line)  # what `run` prints last
    shown = CliRunner().invoke(cli, ["show", "f", "--db", db])
    assert shown.exit_code == 0 and line in shown.output
    clean = CliRunner().invoke(cli, ["show", "--db", db, "f", "--json"])
    assert json.loads(clean.output)["failures"]["failed"] == failures["failed"]


# --- structured output -------------------------------------------------------------


def test_response_format_json_schema_is_sent_and_covered_by_the_request_hash(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'j.db'}"
    args = ["run", "--backend", "openai", "--model", "sim-model", "--base-url", sim_server.base_url, "--data",
            str(EXAMPLES / "qa"), "--batch-size", "12", "--epochs", "1", "-q", "--db", db,
            "--set", "optimizer.response_format=json_schema", "--run-id", "j"]
    res = CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 0, res.output
    store = Store(db)
    with store.engine.connect() as conn:
        from skillstate.storage.store import llm_calls
        requests = [json.loads(r[0]) for r in conn.execute(llm_calls.select().with_only_columns(
            llm_calls.c.request).where(llm_calls.c.role == "optimizer"))]
    formats = {r["response_format"]["json_schema"]["name"] for r in requests}
    assert "AnalystReply" in formats and all(r["response_format"]["type"] == "json_schema" for r in requests)
    target = [json.loads(r[0]) for r in store.engine.connect().execute(
        llm_calls.select().with_only_columns(llm_calls.c.request).where(llm_calls.c.role == "target"))]
    assert all("response_format" not in r for r in target)  # only the optimizer asks for it
    store.close()


def test_the_response_format_changes_the_request_hash_and_text_mode_keeps_old_hashes():
    from skillstate.engine.parsing import AnalystReply, response_format
    from skillstate.llm.base import ChatRequest

    msgs = [{"role": "user", "content": "x"}]
    plain = ChatRequest.build("openai", "m", msgs, 0.0, 10, response_format("text", AnalystReply))
    assert "response_format" not in plain.to_dict()
    schema = ChatRequest.build("openai", "m", msgs, 0.0, 10, response_format("json_schema", AnalystReply))
    mode = ChatRequest.build("openai", "m", msgs, 0.0, 10, response_format("json_object", AnalystReply))
    assert len({plain.hash, schema.hash, mode.hash}) == 3
    assert response_format("json_schema", None) == {"type": "json_object"}  # a call with no fixed shape


# --- the database refusing a write mid-run -----------------------------------------


def test_a_database_error_mid_run_stops_cleanly_with_a_resume_hint_naming_the_database(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'full.db'}"
    real = Store.append
    calls = {"n": 0}

    def failing_append(self, run_id, new_events, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OperationalError("INSERT", {}, Exception("database or disk is full"))
        return real(self, run_id, new_events, **kw)

    monkeypatch.setattr(Store, "append", failing_append)
    res = CliRunner().invoke(cli, ["run", "--run-id", "full", "--epochs", "1", "-q", "--db", db])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "database error: database or disk is full; the run is saved" in res.output
    assert f"skillstate resume full --db {db}" in res.output
    monkeypatch.setattr(Store, "append", real)
    assert CliRunner().invoke(cli, ["resume", "full", "-q", "--db", db]).exit_code == 0
    assert CliRunner().invoke(cli, ["audit", "full", "--db", db]).exit_code == 0


def test_storage_stop_carries_the_run_id():
    err = StorageStop("database error: disk full", "r1")
    assert err.run_id == "r1" and str(err) == "database error: disk full"


# --- keyed audit and the recorded head -------------------------------------------


def _rehash_from(store: Store, run_id: str, seq: int, payload: str) -> None:
    """Rewrite event `seq` and re-hash the chain after it, as a forger without the key would."""
    own = store.read_events(run_id)
    prev = own[seq - 2].hash if seq > 1 else own[0].prev_hash
    with store.engine.begin() as conn:
        for s in own[seq - 1:]:
            body = payload if s.seq == seq else s.payload
            h = event_hash(prev, s.run_id, s.seq, s.type, s.version, body)
            conn.execute(update(events).where(events.c.run_id == run_id, events.c.seq == s.seq)
                         .values(payload=body, prev_hash=prev, hash=h))
            prev = h


def test_a_rehashed_chain_passes_unkeyed_audit_but_not_keyed_audit(tmp_path, monkeypatch):
    db = f"sqlite:///{tmp_path / 'k.db'}"
    monkeypatch.setenv(AUDIT_KEY_ENV, "team-secret")
    assert CliRunner().invoke(cli, ["run", "--run-id", "k", "--epochs", "1", "-q", "--db", db]).exit_code == 0
    ok = CliRunner().invoke(cli, ["audit", "k", "--db", db])
    assert ok.exit_code == 0 and "signatures" in ok.output
    store = Store(db)
    gate = next(s for s in store.read_events("k") if s.type == "GateDecided")
    _rehash_from(store, "k", gate.seq, gate.payload.replace('"reason":"', '"reason":"forged '))
    store.close()
    monkeypatch.delenv(AUDIT_KEY_ENV)
    assert CliRunner().invoke(cli, ["audit", "k", "--db", db]).exit_code == 0  # unkeyed: undetectable
    monkeypatch.setenv(AUDIT_KEY_ENV, "team-secret")
    bad = CliRunner().invoke(cli, ["audit", "k", "--db", db])
    assert bad.exit_code == 1 and f"event {gate.seq} (GateDecided): signature mismatch" in bad.output
    monkeypatch.setenv(AUDIT_KEY_ENV, "another-key")
    assert "signature mismatch" in CliRunner().invoke(cli, ["audit", "k", "--db", db]).output
    resumed = CliRunner().invoke(cli, ["replay", "k", "--to-step", "1", "--db", db])
    assert resumed.exit_code == 1 and "signature mismatch" in resumed.output


def test_a_recorded_head_catches_a_cut_tail(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["run", "--run-id", "h", "--epochs", "1", "-q", "--db", db]).exit_code == 0
    recorded = CliRunner().invoke(cli, ["head", "h", "--db", db]).output.strip()
    seq, h = recorded.split(":")
    assert int(seq) > 10 and len(h) == 64
    assert CliRunner().invoke(cli, ["audit", "h", "--head", recorded, "--db", db]).exit_code == 0
    store = Store(db)
    with store.engine.begin() as conn:
        conn.execute(events.delete().where(events.c.run_id == "h", events.c.seq >= int(seq) - 2))
    store.close()
    assert CliRunner().invoke(cli, ["audit", "h", "--db", db]).exit_code == 0  # a cut tail is a valid chain
    cut = CliRunner().invoke(cli, ["audit", "h", "--head", recorded, "--db", db])
    assert cut.exit_code == 1 and "is not in the log (its tail was cut or its past rewritten)" in cut.output
    bad = CliRunner().invoke(cli, ["audit", "h", "--head", "12:nothex", "--db", db])
    assert bad.exit_code == 2 and "--head takes SEQ:HASH" in bad.output


# --- the plan shown before a run on a real endpoint ----------------------------------


def test_a_new_openai_run_shows_its_plan_first_and_a_sim_run_does_not(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    args = ["run", "--model", "sim-model", "--base-url", sim_server.base_url, "--data", str(EXAMPLES / "qa"),
            "--batch-size", "12", "--epochs", "1", "--run-id", "p", "--db", db,
            "--set", 'prices={"sim-model": [1.0, 2.0]}']
    res = CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 0, res.output
    plan = next(line for line in res.output.splitlines() if line.startswith("plan: "))
    # 36 train items / 12 = 3 steps; target: val 24 + test 2 x 24 + 3 x (12 rollouts + 24 gate items) = 180
    assert plan.startswith("plan: 3 steps, at most 180 target, ") and "about $" in plan
    sim = CliRunner().invoke(cli, ["run", "--epochs", "1", "--run-id", "s", "--db", db])
    assert sim.exit_code == 0 and "plan: " not in sim.output


def test_the_plan_counts_steps_and_calls_from_the_schedule():
    from skillstate.config import SkillConfig
    from skillstate.reading.plan import plan_run

    splits = {"train": [{"id": str(i), "question": "q" * 40} for i in range(100)],
              "val": [{"id": f"v{i}", "question": "q"} for i in range(20)],
              "test": [{"id": f"t{i}", "question": "q"} for i in range(30)]}
    plan = plan_run(SkillConfig(num_epochs=3, batch_size=40), splits, "# skill\n")
    assert plan.steps == 9  # ceil(100 / 40) = 3 steps a epoch
    assert plan.calls["target"] == 20 + 2 * 30 + 9 * (40 + 20)
    assert plan.calls["optimizer"] > 9 and plan.cost_usd > 0 and not plan.unpriced
    unknown = plan_run(SkillConfig(backend="openai", target={"model": "x"}, optimizer={"model": "x"}), splits, "")
    assert unknown.unpriced == ["x"] and "cost unknown (no price for x)" in unknown.describe()
    assert "max_calls" not in plan.describe()
    budget = plan_run(SkillConfig(num_epochs=3, batch_size=40, max_calls=500), splits, "# skill\n")
    assert budget.describe().endswith("; max_calls 500 ends the steps sooner if reached")


def test_a_target_reply_cut_at_max_tokens_is_scored_and_its_failure_says_so(tmp_path):
    class CutTarget:
        name = "sim"

        def __init__(self, inner):
            self.inner = inner

        def complete(self, request):
            resp = self.inner.complete(request)
            if "<skill>" in request.messages[-1][1]:
                return resp
            return ChatResponse("The answer is", resp.prompt_tokens, 512, "length")

    base = scripted_factory()
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    result = Trainer(small_config(num_epochs=1, eval_test=False), store=store, run_id="t",
                     backend_factory=lambda c, e, r: CutTarget(base(c, e, r))).train()
    assert result.state.completed
    rollout = next(s.event for s in store.read_events("t") if s.type == "RolloutCompleted")
    assert rollout.results and all(r.fail_reason.endswith("(reply truncated at max_tokens)") for r in rollout.results)
    assert not [c for c in store.read_calls("t") if c.error and c.role == "target"]  # an answer, not a failed call
    store.close()
