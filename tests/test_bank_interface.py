"""The bank through the CLI: a bank file given as the initial skill or to
eval, `why` on such a bank, `show --step 0`, the export help, SkillRL's bank
JSON and the training-data exports of bank runs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import small_config, trajectories_file

from skillstate.bank.document import read_bank
from skillstate.cli.main import cli
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

BANK = dict(mode="bank", num_epochs=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run s, seeded from imported trajectories; its best bank as bank.json; run f, started from that file."""
    tmp = tmp_path_factory.mktemp("iface")
    store = Store(f"sqlite:///{tmp / 'i.db'}")
    source = trajectories_file(tmp / "traj.jsonl")
    Trainer(small_config(**BANK, bank={"trajectories": source}), store=store, run_id="s").train()
    bank_file = tmp / "bank.json"
    bank_file.write_text(store.get_blob(store_state(store, "s").best_skill), encoding="utf-8")
    Trainer(small_config(**BANK, initial_skill=str(bank_file)), store=store, run_id="f").train()
    return store, tmp, bank_file


def store_state(store, run_id):
    from skillstate.engine.loading import load_run

    return load_run(store, run_id).state


def invoke(store, *args):
    return CliRunner().invoke(cli, [*args, "--db", store.display_url])


def test_why_finds_the_skills_of_the_initial_bank_file(runs):
    store, _, bank_file = runs
    skill = read_bank(bank_file.read_text()).skills[0]
    res = invoke(store, "why", "f", skill.id, "--json")
    assert res.exit_code == 0, res.output
    (info,) = json.loads(res.output)["skills"]
    assert info["event"] == "RunStarted" and info["in_best_bank"] == (
        read_bank(store.get_blob(store_state(store, "f").best_skill)).by_id(skill.id) is not None)
    text = invoke(store, "why", "f", skill.title)
    assert text.exit_code == 0 and "the bank file the run started from" in text.output


def test_show_step_0_is_the_baseline_and_the_seeding(runs):
    store, _, _ = runs
    seeded = invoke(store, "show", "s", "--step", "0")
    assert seeded.exit_code == 0, seeded.output
    assert "step 0 (the baseline)" in seeded.output and "seeded from 24 imported trajectories" in seeded.output
    assert "baseline on val" in seeded.output
    data = json.loads(invoke(store, "show", "f", "--step", "0", "--json").output)
    assert data["step"] == 0 and "seeded" not in data and data["baseline"]["items"] == 60
    assert invoke(store, "show", "f", "--step", "1").exit_code == 0


def test_export_help_agrees_with_what_it_exports(runs):
    store, _, _ = runs
    help_text = " ".join(invoke(store, "export", "--help").output.split())
    assert "Without --step: the run's best skill" in help_text and "rather than the current one" not in help_text
    state = store_state(store, "s")
    assert invoke(store, "export", "s").output.strip() == store.get_blob(state.best_skill).strip()


def test_eval_scores_a_bank_file_in_mode_bank_and_refuses_a_contradicting_mode(runs, tmp_path):
    store, _, bank_file = runs
    auto = invoke(store, "eval", "--skill", str(bank_file), "--run-id", "e-auto", "--json")
    explicit = invoke(store, "eval", "--skill", str(bank_file), "--set", "mode=bank", "--run-id", "e-bank", "--json")
    assert auto.exit_code == 0 and explicit.exit_code == 0, auto.output + explicit.output
    assert json.loads(auto.output)["test"] == json.loads(explicit.output)["test"]
    assert store_state(store, "e-auto").config["mode"] == "bank"
    clash = invoke(store, "eval", "--skill", str(bank_file), "--set", "mode=skill", "-q")
    assert clash.exit_code == 2 and len(clash.output.strip().splitlines()) == 1 and "is a skill bank" in clash.output
    markdown = tmp_path / "s.md"
    markdown.write_text("# Skill\n- Be brief.\n", encoding="utf-8")
    wrong = invoke(store, "eval", "--skill", str(markdown), "--set", "mode=bank", "-q")
    assert wrong.exit_code == 2 and "not a skill bank" in wrong.output


def test_a_skillrl_bank_file_starts_a_run_and_is_evaluated(runs, tmp_path):
    from skillstate.bank.skillrl_format import to_skillrl

    store, _, bank_file = runs
    skillrl = tmp_path / "skillrl.json"
    skillrl.write_text(json.dumps(to_skillrl(read_bank(bank_file.read_text()))), encoding="utf-8")
    res = invoke(store, "eval", "--skill", str(skillrl), "--run-id", "e-skillrl", "--json")
    assert res.exit_code == 0, res.output
    state = store_state(store, "e-skillrl")
    assert state.config["mode"] == "bank"
    started, original = read_bank(store.get_blob(state.best_skill)), read_bank(bank_file.read_text())
    assert sorted((s.id, s.principle, s.category or "") for s in started.skills) == sorted(
        (s.id, s.principle, s.category or "") for s in original.skills)  # general skills first; no provenance
    assert started.mistakes == original.mistakes


def test_export_writes_a_bank_in_skillrls_format(runs, tmp_path):
    from skillstate.bank.skillrl_format import from_skillrl

    store, _, _ = runs
    out = tmp_path / "skillrl.json"
    res = invoke(store, "export", "s", "--format", "skillrl", "-o", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert set(data) == {"general_skills", "task_specific_skills", "common_mistakes", "metadata"}
    best = read_bank(store.get_blob(store_state(store, "s").best_skill))
    assert {s.id for s in from_skillrl(data).skills} == {s.id for s in best.skills}
    into = invoke(store, "export", "s", "--format", "skillrl", "--into", str(tmp_path / "d"))
    assert into.exit_code == 2 and not (tmp_path / "d").exists()


def test_export_sft_with_imported_adds_the_successful_imported_trajectories(runs, tmp_path):
    store, _, _ = runs
    plain, both = tmp_path / "plain.jsonl", tmp_path / "both.jsonl"
    assert invoke(store, "export-sft", "s", "-o", str(plain)).exit_code == 0
    res = invoke(store, "export-sft", "s", "--with-imported", "-o", str(both))
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in both.read_text().splitlines()]
    assert len(rows) == len(plain.read_text().splitlines()) + 16  # 16 of the 24 imported trajectories succeeded
    assert "(16 from imported trajectories)" in res.output
    first = rows[0]["messages"]
    assert first[0]["role"] == "system" and first[0]["content"].startswith("# Skills for this task")
    assert [m["role"] for m in first[1:]] == ["user", "assistant"]
    none = invoke(store, "export-sft", "f", "--with-imported", "-o", str(tmp_path / "n.jsonl"))
    assert none.exit_code == 2 and "imported no trajectories" in none.output and not (tmp_path / "n.jsonl").exists()


def test_export_grpo_on_episodes_groups_each_tasks_episodes(tmp_path, monkeypatch):
    from conftest import EXAMPLES

    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_episode"))
    monkeypatch.delitem(__import__("sys").modules, "rooms_env", raising=False)
    db = f"sqlite:///{tmp_path / 'e.db'}"
    skill = tmp_path / "rooms.md"
    skill.write_text("- Open a closed door before going through it.\n", encoding="utf-8")
    run = CliRunner().invoke(cli, ["eval", "--skill", str(skill), "--env", "python:rooms_env:RoomsEnv", "--split",
                                   "train", "--samples", "3", "--set", "target.temperature=1.0", "--set",
                                   "episode.max_turns=20", "--run-id", "ge", "--db", db, "-q"])
    assert run.exit_code == 0, run.output
    out = tmp_path / "g.jsonl"
    res = CliRunner().invoke(cli, ["export-grpo", "ge", "-o", str(out), "--db", db])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows and f"wrote {len(rows)} groups" in res.output
    for row in rows:
        assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "Task:" in row["prompt"][1]["content"]
        assert len(row["sampled_completions"]) == len(row["rewards"]) == len(row["turns"]) == 3
        for conversation, turns in zip(row["sampled_completions"], row["turns"], strict=True):
            assert [m["role"] for m in conversation][:2] == ["assistant", "user"]
            assert sum(m["role"] == "assistant" for m in conversation) == turns
    monkeypatch.delitem(__import__("sys").modules, "rooms_env", raising=False)


def test_export_grpo_with_nothing_to_export_writes_nothing(runs, tmp_path, monkeypatch):
    from skillstate.exports import training_data

    store, _, _ = runs
    monkeypatch.setattr(training_data, "grpo_rows", lambda store, run_id: ([], 5, 0))
    out = tmp_path / "empty.jsonl"
    res = invoke(store, "export-grpo", "s", "-o", str(out))
    assert res.exit_code == 2 and "no group to export; 5 tool-calling items skipped" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()
