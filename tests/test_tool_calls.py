"""Function calling in the LLM layer: requests carry `tools`, replies carry
`tool_calls`, both are in the request hash and the journal, and they work
through the real `openai` client against the local sim server."""

from __future__ import annotations

import json

import pytest

from skillstate.llm.base import CallFailed, ChatRequest, ChatResponse, ToolCall
from skillstate.llm.openai_backend import parse_chat_body
from skillstate.util import hash_value

TOOLS = [{"type": "function", "function": {"name": "sql", "description": "run a query",
                                           "parameters": {"type": "object",
                                                          "properties": {"query": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "skill"}, {"role": "user", "content": "How many?"}]


def test_a_request_without_tools_hashes_as_it_always_did():
    req = ChatRequest.build("sim", "m", MESSAGES, 0.0, 16)
    old = {"backend": "sim", "model": "m", "messages": MESSAGES, "temperature": 0.0, "max_tokens": 16}
    assert req.hash == hash_value(old) and "tools" not in req.to_dict()


def test_tools_and_tool_messages_are_in_the_hash():
    plain = ChatRequest.build("sim", "m", MESSAGES, 0.0, 16)
    with_tools = ChatRequest.build("sim", "m", MESSAGES, 0.0, 16, tools=TOOLS)
    assert with_tools.hash != plain.hash and with_tools.to_dict()["tools"] == TOOLS
    call = ToolCall("call_1", "sql", '{"query": "select 1"}')
    convo = MESSAGES + [{"role": "assistant", "content": "", "tool_calls": [call.to_message()]},
                        {"role": "tool", "tool_call_id": "call_1", "content": '{"rows": [[1]]}'}]
    req = ChatRequest.build("sim", "m", convo, 0.0, 16, tools=TOOLS)
    assert req.message_dicts() == convo  # the exact messages go back out, and into the journal
    other = ChatRequest.build("sim", "m", convo[:-1] + [{**convo[-1], "tool_call_id": "call_2"}], 0.0, 16,
                              tools=TOOLS)
    assert other.hash != req.hash


def test_tool_calls_round_trip_through_the_journal_form():
    resp = ChatResponse("", 3, 4, "tool_calls", (ToolCall("c1", "sql", '{"query": "x"}'),))
    assert ChatResponse.from_dict(json.loads(json.dumps(resp.to_dict()))) == resp
    assert "tool_calls" not in ChatResponse("hi").to_dict()


def _body(message, finish="tool_calls"):
    return json.dumps({"choices": [{"index": 0, "finish_reason": finish, "message": message}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 2}})


def test_the_openai_body_parser_reads_tool_calls():
    msg = {"role": "assistant", "content": None,
           "tool_calls": [{"id": "call_9", "type": "function",
                           "function": {"name": "sql", "arguments": "{\"query\": \"select 1\"}"}}]}
    resp = parse_chat_body(_body(msg), "application/json", RuntimeError)
    assert resp.text == "" and resp.tool_calls == (ToolCall("call_9", "sql", '{"query": "select 1"}'),)


@pytest.mark.parametrize("bad", ["nope", [{"type": "function"}], [{"function": {"arguments": "{}"}}]])
def test_malformed_tool_calls_are_a_failed_call(bad):
    with pytest.raises(CallFailed, match="malformed reply: tool_calls"):
        parse_chat_body(_body({"role": "assistant", "content": None, "tool_calls": bad}), "application/json",
                        RuntimeError)


SQL_RUN = {"env": "sql", "num_epochs": 1, "batch_size": 12, "minibatch_size": 4,
           "episode": {"max_turns": 6, "max_invalid": 3}}


def test_a_tool_using_run_through_the_openai_client_matches_the_sim_backend(tmp_path, monkeypatch):
    from sqlalchemy import select

    from skillstate.cli.tools import sim_world_named
    from skillstate.config import SkillConfig
    from skillstate.reading.audit import audit, verify
    from skillstate.sim.server import SimServer
    from skillstate.storage.schema import llm_calls
    from skillstate.trainer import Trainer

    monkeypatch.setenv("OPENAI_API_KEY", "local-test-key")
    sim = Trainer(SkillConfig(**SQL_RUN), db=f"sqlite:///{tmp_path / 's.db'}", run_id="s").train().summary
    with SimServer(sim_world_named("sql", None)) as server:
        role = {"model": "sim", "base_url": server.base_url, "max_retries": 0}
        cfg = SkillConfig(**SQL_RUN, backend="openai", target=role, optimizer=role)
        result = Trainer(cfg, db=f"sqlite:///{tmp_path / 'o.db'}", run_id="o").train()
    s = result.summary
    assert s["status"] == "completed"
    # the same world behind HTTP: the same scores, decisions and usage as in-process
    for key in ("baseline_score", "best_score", "accepts", "rejects"):
        assert s[key] == sim[key]
    assert s["test"] == sim["test"]
    with result.store.engine.connect() as conn:
        rows = list(conn.execute(select(llm_calls.c.request, llm_calls.c.response).where(
            llm_calls.c.role == "target")))
    decode = lambda v: json.loads(v) if isinstance(v, str) else v  # noqa: E731
    sent_tools = [decode(r) for r, _ in rows if "tools" in decode(r)]
    called = [decode(resp) for _, resp in rows if resp is not None and decode(resp).get("tool_calls")]
    assert sent_tools and called
    assert {t["function"]["name"] for t in sent_tools[0]["tools"]} == {"sql", "schema"}
    assert any(m["role"] == "tool" for r in sent_tools for m in r["messages"])  # results went back as tool messages
    assert audit(result.store, "o").ok
    report = verify(result.store, "o")
    assert report.ok and report.checked == report.total


def test_eval_scores_a_skill_in_the_sql_env_and_the_rule_it_holds_shows(tmp_path):
    from click.testing import CliRunner

    from skillstate.cli.main import cli

    skill = tmp_path / "agent.md"
    skill.write_text("# Database assistant\n\n- For count questions, query the database with the sql tool and "
                     "answer with the value it returns; never answer from memory.\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["eval", "--skill", str(skill), "--env", "sql", "--split", "val", "--json",
                                   "--db", f"sqlite:///{tmp_path / 'e.db'}"])
    assert res.exit_code == 0, res.output
    by_type = json.loads(res.output)["test"]["eval"]["by_task_type"]
    assert by_type["count"]["hard"] == 1.0
    assert max(v["hard"] for k, v in by_type.items() if k != "count") < 1.0
