"""The sim server's latency option, its calls counted per role, and the sim
answering requests laid out the way another program (skillrl) lays them
out: markdown sections instead of skillstate's tags."""

from __future__ import annotations

import json
import threading
import time

import pytest
from click.testing import CliRunner

from skillstate.cli.main import cli
from skillstate.config import ModelConfig
from skillstate.llm.base import ChatRequest
from skillstate.llm.openai_backend import OpenAIBackend
from skillstate.sim.backend import SimBackend
from skillstate.sim.reading import read_request
from skillstate.sim.server import SimServer
from skillstate.sim.world import RULES, SimWorld, bundled_skill

SKILL = bundled_skill()


def _ask(server: SimServer, text: str, system: str = SKILL) -> str:
    backend = OpenAIBackend(ModelConfig(base_url=server.base_url, api_key_env="SIM_LATENCY_KEY", max_retries=0),
                            "target")
    request = ChatRequest.build("openai", "sim", [{"role": "system", "content": system},
                                                  {"role": "user", "content": text}], 0.0, 16)
    return backend.complete(request).text


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("SIM_LATENCY_KEY", "local")


def test_latency_delays_each_reply_without_queueing_concurrent_ones(sim_world, key):
    question = next(iter(sim_world.by_question))
    with SimServer(sim_world, latency=0.3) as server:
        start = time.monotonic()
        _ask(server, f"Question: {question}")
        one = time.monotonic() - start
        threads = [threading.Thread(target=_ask, args=(server, f"Question: {question}")) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert one >= 0.3
    assert server.calls == {"target": 9, "optimizer": 0}
    assert all(end - begin >= 0.3 for _, begin, end in server.spans)
    # In parallel, not in a queue: the server held several at once. (Asked of the spans, not of a wall-clock
    # bound, which a busy machine stretches; a queue would hold one at a time.)
    moments = sorted([(begin, 1) for _, begin, _ in server.spans] + [(end, -1) for _, _, end in server.spans])
    held = [sum(step for _, step in moments[:i + 1]) for i in range(len(moments))]
    assert max(held) >= 4, server.spans


def test_latency_must_not_be_negative(sim_world):
    with pytest.raises(ValueError):
        SimServer(sim_world, latency=-0.1)
    res = CliRunner().invoke(cli, ["sim-server", "--latency", "-1"])
    assert res.exit_code == 2 and "--latency" in res.output
    assert "--latency SECONDS" in CliRunner().invoke(cli, ["sim-server", "--help"]).output


def _trajectory(item: dict, answer: str, hard: int) -> str:
    return (f"### Task id={item['id']} hard={hard} soft={float(hard):.2f}\nQuestion: {item['question']}\n"
            f"Reference: {item['answers'][0]}\nModel answer: {answer}\nConversation:\n[system] {SKILL}")


def _sectioned(skill: str, title: str, body: str, budget: int = 4) -> str:
    return (f"## Current Skill\n{skill}\n\n## Edit Budget\nProduce AT MOST {budget} edits.\n\n"
            f"## {title}\n{body}")


def test_a_skillrl_shaped_analyst_request_gets_edits_for_the_failing_task_types(sim_world: SimWorld):
    arithmetic = [i for i in sim_world.items.values() if i["task_type"] == "arithmetic"][:8]
    body = "\n\n---\n\n".join(_trajectory(i, i["wrong"], 0) for i in arithmetic)
    backend = SimBackend(sim_world)
    proposed = []
    for n in range(12):  # the sim analyst is fallible: over a dozen minibatches it proposes the rule
        prompt = _sectioned(SKILL, f"Failed Trajectories ({len(arithmetic)} total)", body + "\n" * n)
        role, reply = backend.answer([{"role": "system", "content": "You are a Reflect Analyst."},
                                      {"role": "user", "content": prompt}])
        assert role == "optimizer"
        try:
            edits = json.loads(reply.text)["edits"]
        except (ValueError, KeyError):
            continue  # one of its unusable replies
        assert len(edits) <= 4
        proposed += [e["content"] for e in edits]
    assert any(RULES["arithmetic"].key in c.lower() for c in proposed)
    assert not any(RULES["reading"].key in c.lower() for c in proposed)  # keyed on the failures it was shown


def test_skillrl_shaped_merge_and_rank_requests(sim_world: SimWorld):
    backend = SimBackend(sim_world)
    rule, other = RULES["arithmetic"].variants
    patches = [{"edits": [{"op": "insert_after", "target": "## Rules", "content": f"- {rule}"}]},
               {"edits": [{"op": "insert_after", "target": "## Rules", "content": f"- {other}"},
                          {"op": "delete", "target": "- Always answer with a single word.", "content": ""}]}]
    merge = f"## Current Skill\n{SKILL}\n\n## Patches to merge (2 total, merge level 1)\n{json.dumps(patches)}"
    pool = "\n".join(["[0] op=insert_after  target='## Rules'  content='- Keep answers short.'",
                      f"[1] op=insert_after  target='## Rules'  content={('- ' + rule)!r}  support=8",
                      "[2] op=delete  target='- Always answer with a single word.'  source=failure"])
    rank = (f"## Current Skill\n{SKILL}\n\n## Edit Pool (3 edits, budget=2)\n{pool}\n\n"
            "Select the 2 most important edits.")
    merged, ranked = [], []
    for n in range(6):
        _, reply = backend.answer([{"role": "user", "content": merge + " " * n}])
        if reply.text.startswith("{"):
            merged.append(json.loads(reply.text)["edits"])
        _, reply = backend.answer([{"role": "user", "content": rank + " " * n}])
        if reply.text.startswith("{"):
            ranked.append(json.loads(reply.text)["selected_indices"])
    assert merged and all(len(m) == 2 for m in merged)  # the two wordings of one rule are one edit
    assert ranked and all(len(r) == 2 and set(r) <= {0, 1, 2} for r in ranked)
    assert sum(0 not in r for r in ranked) >= len(ranked) // 2  # the useless edit is ranked last more often than not


def test_the_target_answers_skillrl_shaped_questions_by_the_skill(sim_world: SimWorld):
    backend = SimBackend(sim_world)
    items = [i for i in sim_world.items.values() if i["task_type"] == "arithmetic"]
    with_rule = SKILL.replace("- Always answer", f"- {RULES['arithmetic'].variants[0]}\n- Always answer")

    def right(skill: str) -> int:
        n = 0
        for item in items:
            role, reply = backend.answer([{"role": "system", "content": skill},
                                          {"role": "user", "content": f"Question: {item['question']}\n\nAnswer:"}])
            assert role == "target"
            n += reply.text == item["answers"][0]
        return n

    assert right(with_rule) > right(SKILL)


def test_skillstate_prompts_are_not_read_as_sectioned(sim_world: SimWorld):
    assert read_request("Question: What is 2 + 3 × 4?\n\nReply with the final answer only.", sim_world) is None
    assert read_request("<skill>\n# Skill\n## Rules\n</skill>\n<failures>\n[]\n</failures>", sim_world) is None
