"""`optimizer.response_format: json_schema` sends each reply schema with its
properties in their declared order (the order a constrained server such as
llama.cpp makes the model write them), while the request hash stays that of
the canonical, sorted JSON: requests journaled before keep their hashes."""

from __future__ import annotations

import json
import re

import openai
import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from skillstate.cli.main import cli
from skillstate.engine.bank import EvolveReply, TeacherReply
from skillstate.engine.parsing import (
    AnalystReply,
    GuidanceReply,
    MemoReply,
    MergeReply,
    RankReply,
    SkillReply,
    SuggestionReply,
    response_format,
)
from skillstate.llm.base import ChatRequest
from skillstate.prompts import resolve_prompts
from skillstate.sim.server import constrained_reply
from skillstate.storage.store import Store, llm_calls
from skillstate.util import canonical_json, sha256_text

EDIT_ORDER = ["op", "target", "content"]
ANALYST_ORDER = ["reasoning", "failure_summary", "edits"]
TOOLS = [{"type": "function", "function": {"name": "search", "description": "d", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query", "limit"]}}}]
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def _reordered(value, reverse: bool):
    """`value` with the keys of every object sorted (or sorted backwards)."""
    if isinstance(value, dict):
        return {k: _reordered(value[k], reverse) for k in sorted(value, reverse=reverse)}
    if isinstance(value, list):
        return [_reordered(v, reverse) for v in value]
    return value


def _schema(fmt_json: str) -> dict:
    return json.loads(fmt_json)["json_schema"]["schema"]


# --- the request: declared order sent, canonical order hashed ----------------------------------


def test_the_schema_is_sent_in_declared_order():
    fmt = response_format("json_schema", AnalystReply)
    request = ChatRequest.build("openai", "qwen", MESSAGES, 0.0, 1024, fmt)
    schema = _schema(request.response_format or "")
    assert list(schema["properties"]) == ANALYST_ORDER
    assert list(schema["$defs"]["EditIn"]["properties"]) == EDIT_ORDER
    tools = ChatRequest.build("openai", "qwen", MESSAGES, 0.0, 512, None, TOOLS).tool_list()
    assert list(tools[0]["function"]["parameters"]["properties"]) == ["query", "limit"]


def test_the_request_hash_ignores_key_order_and_keeps_the_hashes_of_journaled_requests():
    fmt = response_format("json_schema", AnalystReply)
    hashes = {ChatRequest.build("openai", "qwen", MESSAGES, 0.0, 1024, f).hash
              for f in (fmt, _reordered(fmt, False), _reordered(fmt, True))}
    # the hash a run journaled when schemas were sent sorted (computed before the change): resume and
    # `replay --verify` of such a run still find its calls
    assert hashes == {"a77edb6790df5acab4981d48e15124d5ff337efdf5b5c6712f48b4d93c6e60ca"}
    tool_hashes = {ChatRequest.build("openai", "qwen", [MESSAGES[1]], 0.0, 512, None, t).hash
                   for t in (TOOLS, _reordered(TOOLS, False), _reordered(TOOLS, True))}
    assert tool_hashes == {"fad15fd96982ecb6cab6af9fbbe79b1a6c152a7444726702c616be89d4fef2c0"}


def _prompt_key_order(text: str) -> list[str]:
    example = next(line for line in text.splitlines() if line.startswith('{"'))
    return re.findall(r'"(\w+)":', example)


@pytest.mark.parametrize("prompt,model", [
    ("failure_analyst", AnalystReply), ("success_analyst", AnalystReply), ("merge", MergeReply),
    ("merge_final", MergeReply), ("failure_suggestions", SuggestionReply), ("failure_rewrite", SkillReply),
    ("rewrite", SkillReply), ("merge_skills", SkillReply), ("slow_update", GuidanceReply),
    ("meta_skill", MemoReply), ("rank", RankReply), ("distill", TeacherReply), ("evolve", EvolveReply),
])
def test_each_reply_schema_lists_its_fields_in_the_order_its_prompt_asks_for(prompt, model):
    """A constrained server makes the model write the fields in the schema's order; the prompt's example
    shows them in the order the model means to write them (reasoning before conclusions, an edit's op and
    target before its content). Both orders must agree, or a field is lost."""
    schema = model.model_json_schema()
    order: list[str] = []

    def walk(node):
        node = schema["$defs"][node["$ref"].split("/")[-1]] if "$ref" in node else node
        for key, sub in node.get("properties", {}).items():
            order.append(key)
            items = sub.get("items", {})
            if "$ref" in items or "properties" in items:
                walk(items)

    walk(schema)
    asked = _prompt_key_order(resolve_prompts({})[prompt])
    assert [k for k in order if k in asked] == asked


# --- the sim server answers a json_schema as llama.cpp does -------------------------------------


def test_the_sim_server_writes_fields_in_schema_order_and_loses_those_the_order_forbids():
    reply = json.dumps({"reasoning": "r", "failure_summary": ["f"],
                        "edits": [{"op": "append", "target": "", "content": "- check units"}]})
    declared = response_format("json_schema", AnalystReply)
    out = json.loads(constrained_reply(reply, declared))
    # llama.cpp's grammar: the required `edits` first, then the optional fields in the schema's order
    assert list(out) == ["edits", "reasoning", "failure_summary"]
    assert out["edits"] == [{"op": "append", "target": "", "content": "- check units"}]
    # sorted, `content` comes before `target`: a model that names the target first loses the content
    lost = json.loads(constrained_reply(reply, _reordered(declared, False)))
    assert lost["edits"] == [{"op": "append", "target": ""}] and "failure_summary" not in lost
    assert constrained_reply("not json", declared) == "not json"
    assert constrained_reply(reply, {"type": "json_object"}) == reply


def test_through_the_openai_client_the_order_reaches_the_server(sim_server):
    """The real `openai` client keeps the order it is given: a sorted schema loses the edit's content at
    the server, the declared one keeps it."""
    bodies: list[dict] = []
    sim_server.fault = lambda n, path, body: bodies.append(body)
    client = openai.OpenAI(api_key="k", base_url=sim_server.base_url, max_retries=0)
    fmt = response_format("json_schema", MergeReply)
    patches = json.dumps({"edits": [{"op": "append", "target": "", "content": "- a rule"}]})
    messages = [{"role": "user", "content": f"<skill>\n# S\n</skill>\n<patches>\n[{patches}]\n</patches>"}]
    replies = {}
    for name, sent in (("declared", fmt), ("sorted", _reordered(fmt, False))):
        reply = client.chat.completions.create(model="sim", messages=messages, response_format=sent)
        replies[name] = json.loads(reply.choices[0].message.content or "")
    assert list(bodies[0]["response_format"]["json_schema"]["schema"]["$defs"]["EditIn"]["properties"]) == EDIT_ORDER
    assert replies["declared"]["edits"] == [{"op": "append", "target": "", "content": "- a rule"}]
    assert replies["sorted"]["edits"] == [{"op": "append", "target": ""}]


# --- a json_schema run against the sim server keeps its edits ------------------------------------


def _run(server, db: str, run_id: str, fmt: str) -> None:
    args = ["run", "--backend", "openai", "--model", "sim-model", "--base-url", server.base_url, "--data",
            str(EXAMPLES / "qa"), "--batch-size", "12", "--epochs", "1", "-q", "--db", db, "--run-id", run_id,
            "--set", f"optimizer.response_format={fmt}"]
    res = CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 0, res.output


def _patch_edits(store: Store, run_id: str) -> list:
    return [json.loads(e.payload)["edits"] for e in store.read_events(run_id) if e.type == "PatchProposed"]


def _dropped(store: Store, run_id: str) -> list[str]:
    return [d["reason"] for e in store.read_events(run_id) if e.type == "EditsSelected"
            for d in json.loads(e.payload).get("dropped", [])]


def test_a_json_schema_run_keeps_its_edits_and_journals_canonical_requests(sim_server, tmp_path):
    bodies: list[dict] = []
    sim_server.fault = lambda n, path, body: bodies.append(body)
    db = f"sqlite:///{tmp_path / 'j.db'}"
    _run(sim_server, db, "text", "text")
    _run(sim_server, db, "schema", "json_schema")
    store = Store(db)
    try:
        edits = _patch_edits(store, "schema")
        assert any(edits) and edits == _patch_edits(store, "text")  # the same edits as without a schema
        assert all(e["content"] for patch in edits for e in patch if e["op"] in ("append", "insert_after"))
        assert "empty_content" not in _dropped(store, "schema")
        sent = [b["response_format"]["json_schema"]["schema"] for b in bodies
                if b.get("response_format", {}).get("type") == "json_schema"]
        analysts = [s for s in sent if s.get("title") == "AnalystReply"]
        assert analysts and all(list(s["properties"]) == ANALYST_ORDER for s in analysts)
        assert all(list(s["$defs"]["EditIn"]["properties"]) == EDIT_ORDER for s in sent if "$defs" in s)
        with store.engine.connect() as conn:
            rows = conn.execute(llm_calls.select().with_only_columns(
                llm_calls.c.request_hash, llm_calls.c.request).where(llm_calls.c.run_id == "schema")).all()
        # the journal holds the canonical (sorted) text, and the hash is of that text
        assert rows and all(text == canonical_json(json.loads(text)) and sha256_text(text) == h for h, text in rows)
    finally:
        store.close()
    replay = CliRunner().invoke(cli, ["replay", "schema", "--verify", "--db", db])
    assert replay.exit_code == 0, replay.output


# --- extra_body: a server's own sampling knobs (the repeat penalty) ---------------------------------


def test_extra_body_reaches_the_server_and_is_part_of_the_journaled_request(sim_server, tmp_path):
    bodies: list[dict] = []
    sim_server.fault = lambda n, path, body: bodies.append(body)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    args = ["run", "--backend", "openai", "--model", "sim-model", "--base-url", sim_server.base_url, "--data",
            str(EXAMPLES / "qa"), "--batch-size", "12", "--epochs", "1", "-q", "--db", db, "--run-id", "x",
            "--set", "target.extra_body={repeat_penalty: 1.1, top_k: 20}"]
    res = CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 0, res.output
    chats = [b for b in bodies if "messages" in b]
    target = [b for b in chats if "response_format" not in b and b.get("max_tokens") == 512]
    assert target and all(b["repeat_penalty"] == 1.1 and b["top_k"] == 20 for b in target)
    assert all("repeat_penalty" not in b for b in chats if b.get("max_tokens") == 4096)  # optimizer: not set
    store = Store(db)
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(llm_calls.select().with_only_columns(llm_calls.c.role, llm_calls.c.request)).all()
    finally:
        store.close()
    extra = {role: [json.loads(text).get("extra_body") for r, text in rows if r == role]
             for role in ("target", "optimizer")}
    assert extra["target"] and all(e == {"repeat_penalty": 1.1, "top_k": 20} for e in extra["target"])
    assert not any(extra["optimizer"])  # unset: the request (and its hash) is what it always was
    plain = ChatRequest.build("openai", "m", MESSAGES, 0.0, 10)
    knob = ChatRequest.build("openai", "m", MESSAGES, 0.0, 10, extra_body={"repeat_penalty": 1.1})
    assert plain.hash != knob.hash and ChatRequest.build("openai", "m", MESSAGES, 0.0, 10, extra_body={}) == plain


@pytest.mark.parametrize("value,words", [
    ("{temperature: 0.5}", "'temperature' is set by skillstate itself"),
    ("{messages: []}", "'messages' is set by skillstate itself"),
    ("{repeat_penalty: .nan}", "not plain JSON data"),
    ("7", "invalid config value for optimizer.extra_body"),
    ("{api_key: sk-1234567890abcdef}", "'api_key' looks like a credential"),
    ("{headers: {Authorization: Bearer 1234567890abcdef}}", "a value looks like a credential"),
])
def test_extra_body_refuses_what_skillstate_sets_in_one_line(tmp_path, value, words):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    res = CliRunner().invoke(cli, ["run", "--data", str(EXAMPLES / "qa"), "-q", "--db", db,
                                   "--set", f"optimizer.extra_body={value}"])
    assert res.exit_code == 2 and words in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "r.db").exists()  # refused before anything is written
    assert "1234567890abcdef" not in res.output  # a credential refused is not echoed either


def test_a_zero_price_says_a_local_model_is_free_and_silences_the_warning(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    base = ["run", "--backend", "openai", "--model", "qwen", "--base-url", sim_server.base_url, "--data",
            str(EXAMPLES / "qa"), "--batch-size", "12", "--epochs", "1", "-q", "--db", db]
    unpriced = CliRunner().invoke(cli, [*base, "--run-id", "a"], env={"OPENAI_API_KEY": "k"})
    assert unpriced.exit_code == 0 and "no price for model 'qwen'" in unpriced.output, unpriced.output
    free = CliRunner().invoke(cli, [*base, "--run-id", "b", "--set", 'prices={"qwen": [0, 0]}'],
                              env={"OPENAI_API_KEY": "k"})
    assert free.exit_code == 0 and "no price" not in free.output, free.output
    shown = CliRunner().invoke(cli, ["show", "b", "--db", db])
    assert shown.exit_code == 0 and "no price" not in shown.output


def test_bank_runs_before_categorized_mistakes_send_the_schema_they_sent():
    """A run whose stored distill prompt asks for mistakes as bare lines (every bank run before mistakes had
    categories) sends the teacher's schema as it did, so `optimizer.response_format: json_schema` runs still
    find their journaled calls on resume and verify (the digest was taken from the code before the change)."""
    import hashlib
    import json

    from skillstate.engine.bank import LineMistakesReply
    from skillstate.engine.parsing import response_format

    sent = json.dumps(response_format("json_schema", LineMistakesReply))
    assert hashlib.sha256(sent.encode()).hexdigest() == (
        "ed26094f6ae3383e182dadd704a0b85353f2fc426bd75f07d780f7551b86c163")
