"""`skillstate eval`, cost accounting and prices, the cost budget, the v1
event upcaster and the full-SkillOpt prompt overrides."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, small_config

import skillstate.cli.main  # noqa: F401  (registers the commands)
from skillstate import evaluate_skill
from skillstate.cli.app import cli
from skillstate.config import SkillConfig
from skillstate.engine.runner import lineage_events
from skillstate.errors import ConfigError
from skillstate.log.event_codec import decode, encode
from skillstate.log.events import RunStarted
from skillstate.pricing import DEFAULT_PRICES, price_for
from skillstate.prompts import PROMPT_NAMES, resolve_prompts
from skillstate.sim.world import bundled_splits
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

SIM_TYPES = {"arithmetic", "date_reasoning", "letter_counting", "list_ordering", "reading", "unit_conversion"}


def call(*args, code=0, env=None):
    res = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert res.exit_code == code, res.output
    return res


def as_json(*args):
    return json.loads(call(*args).stdout)


def run_ids(db):
    return {r["run_id"]: r["status"] for r in as_json("runs", "--json", "--db", db)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished small sim run `t` (2 epochs) and its exported best skill."""
    tmp = tmp_path_factory.mktemp("trained")
    db = f"sqlite:///{tmp / 't.db'}"
    Trainer(small_config(), db=db, run_id="t").train().store.close()
    skill = tmp / "best.md"
    call("export", "t", "--best", "-o", skill, "--db", db)
    return db, skill, as_json("show", "t", "--json", "--db", db)


def test_eval_cli_scores_a_skill_as_a_recorded_run(trained):
    db, skill, _ = trained
    text = call("eval", "--skill", skill, "--run-id", "ev", "--db", db).output
    assert "by task type" in text and all(t in text for t in SIM_TYPES)
    s = as_json("eval", "--skill", skill, "--run-id", "ev2", "--json", "--db", db)
    assert s["kind"] == "eval" and s["status"] == "evaluated"
    assert set(s["test"]["eval"]["by_task_type"]) == SIM_TYPES
    assert {i["task_type"] for i in bundled_splits()["test"]} == SIM_TYPES
    assert run_ids(db)["ev"] == run_ids(db)["ev2"] == "evaluated"
    for rid in ("ev", "ev2"):
        call("audit", rid, "--db", db)
        call("replay", rid, "--verify", "--db", db)


def test_eval_splits_and_datasets(trained, tmp_path):
    db, skill, _ = trained
    val = as_json("eval", "--skill", skill, "--split", "val", "--json", "--db", db)
    assert val["test"]["eval"]["split"] == "val" and val["test"]["eval"]["n"] == 60
    qa = as_json("eval", "--skill", skill, "--data", EXAMPLES / "qa", "--split", "train", "--json",
                 "--db", f"sqlite:///{tmp_path / 'qa.db'}")
    assert qa["status"] == "evaluated" and qa["test"]["eval"]["split"] == "train" and qa["test"]["eval"]["n"] == 36


@pytest.mark.parametrize("args, words", [(["--skill", "no_such_skill.md"], "no_such_skill.md"),
                                         (["--split", "nope"], "nope"), (["--backend", "openai"], "model")])
def test_eval_errors_are_one_line_and_create_no_run(trained, tmp_path, args, words):
    db, skill, _ = trained
    before = run_ids(db)
    full = ["eval", *(["--skill", skill] if "--skill" not in args else []), *args, "--db", db]
    res = CliRunner().invoke(cli, [str(a) for a in full], env={"OPENAI_API_KEY": "k"})
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and words in res.stderr and "Traceback" not in res.output
    assert run_ids(db) == before


def test_an_eval_run_cannot_be_forked(trained):
    db, skill, _ = trained
    call("eval", "--skill", skill, "--run-id", "evf", "-q", "--db", db)
    before = run_ids(db)
    call("fork", "evf", "0", "--run-id", "bad", "--db", db, code=2)
    assert run_ids(db) == before


def test_forking_an_eval_run_says_why(trained):
    db, skill, _ = trained
    call("eval", "--skill", skill, "--run-id", "evw", "-q", "--db", db)
    res = call("fork", "evw", "0", "--db", db, code=2)
    assert "evaluation run" in res.stderr


def test_python_eval_of_the_best_skill_matches_the_training_test_score(trained, tmp_path):
    _, skill, summary = trained
    result = evaluate_skill(SkillConfig(initial_skill=str(skill)), "test", db=f"sqlite:///{tmp_path / 'e.db'}")
    ev = result.summary["test"]["eval"]
    assert result.summary["kind"] == "eval" and result.summary["usage"]["target"]["sent"] == ev["n"] == 60
    assert ev["hard"] == summary["test"]["best"]["hard"]
    assert ev["by_task_type"] == summary["test"]["best"]["by_task_type"]


def test_cost_summary_of_a_sim_run(trained):
    db, _, s = trained
    cost = s["cost"]
    assert set(cost["by_role"]) == {"optimizer", "target"} and cost["unpriced_models"] == []
    assert {"baseline", "rollout", "reflect", "aggregate", "gate", "test"} <= set(cost["by_stage"])
    values = [*cost["by_role"].values(), *cost["paid_by_role"].values(), cost["total"], cost["paid"],
              *(v for roles in cost["by_stage"].values() for v in roles.values())]
    assert all(v >= 0 for v in values) and cost["total"] > 0
    assert cost["total"] == pytest.approx(sum(cost["by_role"].values()), abs=1e-6)
    # paid may exceed what the events count only by the calls an early reject let finish in flight
    assert cost["paid"] <= cost["total"] * 1.1
    for role, model in (("target", "sim-target"), ("optimizer", "sim-optimizer")):
        u, (p_in, p_out) = s["usage"][role], DEFAULT_PRICES[model]
        expected = (u["prompt_tokens"] * p_in + u["completion_tokens"] * p_out) / 1e6
        assert cost["by_role"][role] == pytest.approx(expected, abs=1e-6)
        assert sum(r.get(role, 0) for r in cost["by_stage"].values()) == pytest.approx(expected, abs=1e-5)
    assert DEFAULT_PRICES["sim-target"] == (0.15, 0.60) and DEFAULT_PRICES["sim-optimizer"] == (2.00, 8.00)
    assert "cost (USD)" in call("show", "t", "--db", db).output


def test_the_cost_table_counts_each_stages_calls(trained):
    """What a budget of calls (max_calls) counts, by stage: the calls of the stages add up to the run's, as
    the usage table counts them, and the table prints them beside the stages' cost."""
    db, _, s = trained
    cost = s["cost"]
    assert set(cost["calls_by_stage"]) == set(cost["by_stage"])
    assert sum(cost["calls_by_stage"].values()) == cost["calls"] == sum(u["calls"] for u in s["usage"].values())
    assert cost["calls_by_stage"]["rollout"] > 0 and cost["calls_by_stage"]["test"] > 0
    store = Store(db)
    try:  # sent: the rows of the call journal, whatever the events used
        assert cost["paid_calls"] == sum(row[2] for row in store.paid_by_model("t")) > 0
    finally:
        store.close()
    lines = call("show", "t", "--db", db).output.splitlines()
    header = next(line for line in lines if line.startswith("cost (USD)"))
    assert header.split()[2] == "calls"
    total = next(line for line in lines if line.startswith("all stages"))
    assert total.split()[2] == f"{cost['calls']:,}"


def test_price_for():
    assert price_for("gpt-4o") == price_for("gpt-4o-2024-08-06") == (2.50, 10.00)
    assert price_for("gpt-4o-mini") == price_for("gpt-4o-mini-2024-07-18") == (0.15, 0.60)
    assert price_for("sim-model") is None and price_for("claude-x") is None
    assert price_for("gpt-4o", {"gpt-4o": [1.0, 2.0]}) == (1.0, 2.0)
    assert price_for("sim-model", {"sim-model": (3.0, 4.0)}) == (3.0, 4.0)
    assert price_for("gpt-4o-mini-2024-07-18", {"gpt-4o-mini": (9.0, 9.0)}) == (9.0, 9.0)


def _openai_run(server, db, *extra):
    return ["run", "--backend", "openai", "--model", "sim-model", "--base-url", server.base_url,
            "--data", str(EXAMPLES / "qa"), "--batch-size", "12", "--epochs", "1", "-q",
            "--set", "eval_test=false", "--db", db, *extra]


def _unpriced_run(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'u.db'}"
    res = call(*_openai_run(sim_server, db, "--run-id", "u"), env={"OPENAI_API_KEY": "k"})
    return res, as_json("show", "u", "--json", "--db", db)["cost"]


def test_an_unpriced_model_costs_zero(sim_server, tmp_path):
    res, cost = _unpriced_run(sim_server, tmp_path)
    assert any(line.startswith("warning: no price for model 'sim-model'") for line in res.stderr.splitlines())
    assert cost["unpriced_models"] == ["sim-model"]
    assert cost["total"] == cost["paid"] == 0 and set(cost["by_role"].values()) == {0.0}
    assert all(v == 0 for roles in cost["by_stage"].values() for v in roles.values())


def test_an_unpriced_model_draws_exactly_one_warning(sim_server, tmp_path):
    res, _ = _unpriced_run(sim_server, tmp_path)
    warned = [line for line in res.stderr.splitlines()
              if line.startswith("warning: no price for model 'sim-model'")]
    assert len(warned) == 1, res.stderr


def test_prices_config_prices_an_unknown_model(sim_server, tmp_path):
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = call(*_openai_run(sim_server, db, "--run-id", "p", "--set", 'prices={"sim-model": [1.0, 2.0]}'),
               env={"OPENAI_API_KEY": "k"})
    assert "warning" not in res.stderr
    cost = as_json("show", "p", "--json", "--db", db)["cost"]
    assert cost["unpriced_models"] == [] and cost["total"] > 0 and cost["paid"] > 0
    assert all(v > 0 for v in cost["by_role"].values())


def _events(db, run_id):
    store = Store(db)
    events = [(s.type, encode(s.event)) for s in lineage_events(store, run_id)]
    store.close()
    return events


def test_budget_stop_resume_and_equality_with_an_uninterrupted_run(tmp_path):
    db, ref = f"sqlite:///{tmp_path / 'b.db'}", f"sqlite:///{tmp_path / 'ref.db'}"
    res = call("run", "--epochs", "1", "--max-cost-usd", "0.02", "--run-id", "b", "-q", "--db", db, code=3)
    [line] = res.stderr.strip().splitlines()
    assert "cost budget reached" in line and "--max-cost-usd" in line
    call("audit", "b", "--db", db)
    assert as_json("show", "b", "--json", "--db", db)["status"] != "completed"
    again = CliRunner().invoke(cli, ["resume", "b", "--max-cost-usd", "0.05", "-q", "--db", db])
    assert again.exit_code in (0, 3), again.output
    call("audit", "b", "--db", db)  # the log ends at an event boundary
    call("run", "--run-id", "b", "--max-cost-usd", "100", "-q", "--db", db)
    call("run", "--epochs", "1", "--run-id", "c", "-q", "--db", ref)
    done, plain = as_json("show", "b", "--json", "--db", db), as_json("show", "c", "--json", "--db", ref)
    assert done["status"] == plain["status"] == "completed"
    stopped, straight = _events(db, "b"), _events(ref, "c")
    assert stopped[0][0] == straight[0][0] == "RunStarted"
    assert stopped[1:] == straight[1:]
    # what the events count is the same; what was sent differs only by the calls an early reject let finish
    assert {r: u["calls"] for r, u in done["usage"].items()} == {r: u["calls"] for r, u in plain["usage"].items()}
    assert done["cost"]["total"] == pytest.approx(plain["cost"]["total"], abs=1e-6)


def test_fork_accepts_a_budget(trained, tmp_path):
    db, _, _ = trained
    res = call("fork", "t", "1", "--run-id", "fb", "--edit-budget", "2", "--max-cost-usd", "0.001", "-q",
               "--db", db, code=3)
    assert "cost budget reached" in res.stderr
    assert [p for t, p in _events(db, "fb") if t == "RunForked"][0]["config"]["max_cost_usd"] == 0.001
    call("audit", "fb", "--db", db)
    call("resume", "fb", "--max-cost-usd", "100", "-q", "--db", db)
    assert as_json("show", "fb", "--json", "--db", db)["status"] == "completed"


def test_run_started_v1_is_upcast_without_the_step_buffer(trained):
    db, _, _ = trained
    kind, v3 = _events(db, "t")[0]
    assert kind == "RunStarted" and RunStarted.version == 16 and v3["config"]["use_step_buffer"] is True
    v1 = json.loads(json.dumps(v3))
    del v1["config"]["use_step_buffer"]
    up = decode("RunStarted", 1, v1)
    assert up.config["use_step_buffer"] is False
    assert {k: v for k, v in up.config.items() if k != "use_step_buffer"} == v1["config"]
    assert decode("RunStarted", 3, v3).config["use_step_buffer"] is True
    assert decode("RunStarted", 1, v3).config["use_step_buffer"] is True  # a v1 payload with the key keeps it


def test_run_started_v2_is_upcast_without_screening_or_early_reject(trained):
    db, _, _ = trained
    _, v3 = _events(db, "t")[0]
    assert v3["config"]["drop_noop_edits"] is True and v3["config"]["early_reject"] is True
    v2 = json.loads(json.dumps(v3))
    del v2["config"]["drop_noop_edits"], v2["config"]["early_reject"]
    up = decode("RunStarted", 2, v2)
    assert up.config["drop_noop_edits"] is False and up.config["early_reject"] is False
    assert decode("RunStarted", 2, v3).config["early_reject"] is True  # a v2 payload with the key keeps it


def test_run_started_v3_is_upcast_with_early_reject_at_the_step_gate_only(trained):
    db, _, _ = trained
    _, v4 = _events(db, "t")[0]
    assert v4["config"]["early_reject_slow_update"] is True
    v3 = json.loads(json.dumps(v4))
    del v3["config"]["early_reject_slow_update"]
    assert decode("RunStarted", 3, v3).config["early_reject_slow_update"] is False
    forked = {k: v3[k] for k in ("config", "prompts", "steps_per_epoch", "total_steps")}
    forked.update(parent_run_id="p", fork_step=1, parent_event_count=1, parent_event_hash="h", overrides={})
    assert decode("RunForked", 3, forked).config["early_reject_slow_update"] is False


def test_new_prompts_can_be_overridden_inline():
    text = "Rewrite the guidance block.\n$guidance\nReply with JSON only."
    cfg = SkillConfig(prompts={"slow_update": text, "meta_skill": "memo\n$comparison"})
    texts = resolve_prompts(cfg.prompts)
    assert texts["slow_update"] == text and texts["meta_skill"] == "memo\n$comparison"
    assert set(texts) == set(PROMPT_NAMES)
    with pytest.raises(ConfigError) as err:
        resolve_prompts({"slow_updat": "x"})
    assert "slow_updat" in str(err.value) and "slow_update" in str(err.value) and "meta_skill" in str(err.value)


def test_optimizer_prompt_files_ask_for_json_only():
    files = [f for f in resources.files("skillstate.prompts").iterdir() if f.name.endswith(".md")]
    assert set(PROMPT_NAMES) <= {f.name[:-3] for f in files}
    # the targets' user prompts and the optimizer's and the judge's system prompts are not JSON-reply calls
    for f in files:
        if f.name[:-3] not in ("qa_user", "episode_user", "optimizer_system", "disclosure_system", "evals_user",
                               "judge_system"):
            assert "Reply with JSON only" in f.read_text(encoding="utf-8"), f.name


def test_run_started_v5_and_forked_v4_are_upcast_with_repair_and_the_rejected_screen_off(trained):
    """Since RunStarted v6 (RunForked v5) `repair: ablate` and `drop_rejected_edits: 2` are the defaults:
    an older config without the keys ran with both off, and reads so; one with them keeps its values."""
    db, _, _ = trained
    _, v6 = _events(db, "t")[0]
    assert v6["config"]["repair"] == "ablate" and v6["config"]["drop_rejected_edits"] == 2
    v5 = json.loads(json.dumps(v6))
    del v5["config"]["repair"], v5["config"]["drop_rejected_edits"]
    up = decode("RunStarted", 5, v5)
    assert up.config["repair"] == "off" and up.config["drop_rejected_edits"] == 0
    assert decode("RunStarted", 5, v6).config["repair"] == "ablate"  # an explicit value is kept
    forked = {"parent_run_id": "t", "fork_step": 1, "parent_event_count": 1, "parent_event_hash": "x",
              "overrides": {}, "config": v5["config"], "prompts": {}, "steps_per_epoch": 1, "total_steps": 1}
    assert decode("RunForked", 4, forked).config["drop_rejected_edits"] == 0
