"""Training the policy's weights with TRL (`skillstate sft`, `skillstate
grpo`) on a tiny random-weight model built here, no download: the events
(base model identity, data hash, every metric, each checkpoint, each
validation and evolution), a crash and a resume from the last checkpoint,
audit and verify, and the command line. Marker `policy`: they need the
train extra (torch's CPU build, transformers, TRL, PEFT)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, Crash, small_config

from skillstate.cli.main import cli
from skillstate.engine import policy_stages
from skillstate.engine.runner import lineage_events
from skillstate.errors import ConfigError, UserError
from skillstate.log.events_policy import PolicyBankEvolved, PolicyStarted, PolicyTrained, PolicyValidated
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

FAST = {"policy.torch_threads": 1, "policy.eval_max_new_tokens": 6, "policy.max_completion_length": 6,
        "policy.batch_size": 4, "policy.num_generations": 4}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    pytest.importorskip("trl")
    from skillstate.engine.tiny_model import write_tiny_model

    base = tmp_path_factory.mktemp("policy")
    store = Store(f"sqlite:///{base / 'p.db'}")
    Trainer(small_config(mode="bank", data=str(EXAMPLES / "qa"), batch_size=12), store=store, run_id="bank").train()
    model = write_tiny_model(base / "tiny")
    return store, model, base


def _events(store, run_id):
    return [s.event for s in lineage_events(store, run_id)]


def _train(store, method, run_id, model, base, **overrides):
    from skillstate.policy import PolicyTrainer

    sets = {**FAST, "policy.output_dir": str(base / run_id), **overrides}
    return PolicyTrainer(store, method, source_run="bank", base_model=str(model), overrides=sets,
                         run_id=run_id).train()


@pytest.mark.policy
def test_sft_records_the_model_the_data_every_metric_and_each_checkpoint(world):
    from skillstate.engine.policy_model import checkpoint_sha256, files_sha256
    from skillstate.exports.training_data import sft_rows

    store, model, base = world
    result = _train(store, "sft", "sft", model, base, **{"policy.max_steps": 4, "policy.save_steps": 2,
                                                          "policy.validation_interval": 4})
    assert result.state.completed
    events = _events(store, "sft")
    started = next(e for e in events if isinstance(e, PolicyStarted))
    assert started.base_model.sha256 == files_sha256(model)[0] and started.method == "sft"
    rows, _ = sft_rows(store, "bank")
    stored = [json.loads(line) for line in store.get_blob(started.dataset).splitlines()]
    assert stored == rows and started.dataset_rows == len(rows)
    assert started.trainer_config["trainer"] == "SFTTrainer" and started.trainer_config["lora"]["r"] == 8
    trained = [e for e in events if isinstance(e, PolicyTrained)]
    assert [(t.step_from, t.step_to) for t in trained] == [(0, 2), (2, 4)]
    logged = sorted(int(m["step"]) for t in trained for m in t.metrics if "loss" in m)
    assert logged == [1, 2, 3, 4]  # every step's loss, once
    for t in trained:
        assert Path(t.checkpoint.path).is_dir() and checkpoint_sha256(t.checkpoint.path) == t.checkpoint.sha256
        assert (Path(t.checkpoint.path) / "adapter_config.json").is_file()  # LoRA by default
    assert [v.step for v in events if isinstance(v, PolicyValidated)] == [0, 4]  # the base policy, then trained
    assert audit(store, "sft").ok
    report = verify(store, "sft")
    assert report.ok and "not re-executed" in report.note


@pytest.mark.policy
def test_grpo_rewards_from_the_environment_and_evolves_the_bank_through_the_journal(world):
    store, model, base = world
    result = _train(store, "grpo", "grpo", model, base, **{"policy.max_steps": 4, "policy.save_steps": 2,
                                                            "policy.validation_interval": 2,
                                                            "bank.evolution_threshold": 1.0})
    assert result.state.completed
    events = _events(store, "grpo")
    trained = [e for e in events if isinstance(e, PolicyTrained)]
    assert all(any("reward" in m for m in t.metrics) for t in trained)
    evolved = [e for e in events if isinstance(e, PolicyBankEvolved)]
    assert [e.step for e in evolved] == [2]  # between validations, never after the last step
    e = evolved[0]
    assert e.status == "ok" and e.categories and e.call is not None and e.samples
    teacher = [c for c in store.read_calls("grpo") if c.role == "optimizer"]
    assert [c.request_hash for c in teacher] == [e.call.request_hash]  # the teacher's call, journaled
    val_ids = {i["id"] for i in map(json.loads, (EXAMPLES / "qa" / "val.jsonl").read_text().splitlines())}
    assert not {i for ids in e.samples.values() for i in ids} & val_ids  # shown the policy's train failures
    assert trained[0].bank == events[0].initial_skill
    assert trained[1].bank == (e.candidate if e.accepted else e.base_skill)  # prompts use the bank as it stands
    assert audit(store, "grpo").ok and verify(store, "grpo").ok
    rerun = Trainer(store=store, run_id="grpo").train()  # complete: nothing more to do
    assert len(_events(store, "grpo")) == len(events) and rerun.state.completed


def dies_at_the_second_stretch(monkeypatch, *, after_training: bool) -> list:
    """Make the process die (Crash) at the second stretch: before it trains, or once it has trained and written
    its checkpoint but before its event. Returns the checkpoints each stretch resumed from, as they come."""
    real = policy_stages.train_stretch
    seen: list = []

    def dies(**kw):
        seen.append(kw["resume"])
        if len(seen) == 2:
            if after_training:
                real(**kw)
            raise Crash()
        return real(**kw)

    monkeypatch.setattr(policy_stages, "train_stretch", dies)
    return seen


@pytest.mark.policy
def test_a_crash_mid_training_resumes_from_the_last_checkpoint(world, monkeypatch):
    store, model, base = world
    real = policy_stages.train_stretch
    seen = dies_at_the_second_stretch(monkeypatch, after_training=True)  # its checkpoint written, no event
    with pytest.raises(Crash):
        _train(store, "sft", "crash", model, base, **{"policy.max_steps": 6, "policy.save_steps": 2,
                                                       "policy.validation_interval": 6})
    assert [e.step_to for e in _events(store, "crash") if isinstance(e, PolicyTrained)] == [2]
    monkeypatch.setattr(policy_stages, "train_stretch", lambda **kw: seen.append(kw["resume"]) or real(**kw))
    from skillstate.policy import PolicyTrainer

    done = PolicyTrainer(store, "sft", run_id="crash").train()
    assert done.state.completed
    assert seen[0] is None and seen[1].endswith("checkpoint-2") and seen[2].endswith("checkpoint-2")
    trained = [e for e in _events(store, "crash") if isinstance(e, PolicyTrained)]
    assert [(t.step_from, t.step_to) for t in trained] == [(0, 2), (2, 4), (4, 6)]
    assert audit(store, "crash").ok and verify(store, "crash").ok


@pytest.mark.policy
def test_a_changed_checkpoint_or_base_model_stops_in_one_line(world, monkeypatch, tmp_path):
    import shutil

    store, model, base = world
    copy = shutil.copytree(model, tmp_path / "tiny")
    real = policy_stages.train_stretch
    dies_at_the_second_stretch(monkeypatch, after_training=False)
    with pytest.raises(Crash):
        _train(store, "sft", "tamper", copy, base, **{"policy.max_steps": 4, "policy.save_steps": 2,
                                                       "policy.validation_interval": 4})
    monkeypatch.setattr(policy_stages, "train_stretch", real)
    checkpoint = next(e for e in _events(store, "tamper") if isinstance(e, PolicyTrained)).checkpoint
    adapter = Path(checkpoint.path) / "adapter_model.safetensors"
    original = adapter.read_bytes()
    adapter.write_bytes(original[:-8] + b"tampered")
    from skillstate.policy import PolicyTrainer

    with pytest.raises(UserError, match="changed since it was written"):
        PolicyTrainer(store, "sft", run_id="tamper").train()
    assert not verify(store, "tamper").ok
    adapter.write_bytes(original)
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    with pytest.raises(UserError, match="the base model at .* changed since it was written"):
        PolicyTrainer(store, "sft", run_id="tamper").train()


@pytest.mark.policy
def test_the_command_line_trains_shows_and_refuses_bad_input(world, tmp_path):
    store, model, base = world
    db = ["--db", store.display_url]
    sets = [x for k, v in FAST.items() for x in ("--set", f"{k}={v}")]
    res = CliRunner().invoke(cli, ["sft", "bank", "--model", str(model), "--run-id", "cli", "--steps", "2",
                                   "--set", f"policy.output_dir={base / 'cli'}", *sets, "-q", *db])
    assert res.exit_code == 0, res.output
    assert "policy run cli: completed; sft of" in res.output and "2/2 steps" in res.output
    shown = CliRunner().invoke(cli, ["show", "cli", *db])
    assert shown.exit_code == 0 and "last checkpoint: step 2" in shown.output
    data = json.loads(CliRunner().invoke(cli, ["show", "cli", "--json", *db]).output)
    assert data["kind"] == "policy" and [p[0] for p in data["policy"]["curves"]["loss"]] == [1, 2]
    before = len(store.list_runs())
    for args, says in ((["sft", "bank", *db], "--model DIR is required"),
                       (["sft", "bank", "--model", str(tmp_path / "nothing"), *db], "not a Hugging Face model"),
                       (["sft", "no-such-run", "--model", str(model), *db], "no-such-run"),
                       (["grpo", "bank", "--model", str(model), "--set", "policy.num_generations=3", *db],
                        "multiple of policy.num_generations"),
                       (["sft", "--run-id", "cli", "--steps", "3", *db], "continues as it started"),
                       (["fork", "cli", "1", *db], "is a policy training; only training runs can be forked")):
        bad = CliRunner().invoke(cli, args)
        assert bad.exit_code == 2 and says in bad.output, (args, bad.output)
        assert "Traceback" not in bad.output
    assert len(store.list_runs()) == before  # nothing half-written


def test_grpo_refuses_an_episode_environment_in_one_line(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_episode"))
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    Trainer(small_config(mode="bank", env="python:rooms_env:RoomsEnv", num_epochs=1, batch_size=10,
                         env_config={"size": 3}), store=store, run_id="rooms").train()
    from skillstate.policy import PolicyTrainer

    with pytest.raises(ConfigError, match="one-reply environments"):
        PolicyTrainer(store, "grpo", source_run="rooms", base_model=str(tmp_path)).prepare()
    assert [r.run_id for r in store.list_runs()] == ["rooms"]


def test_without_the_train_extra_a_policy_command_says_what_to_install(monkeypatch):
    import importlib.util

    from skillstate.engine.policy_model import require_training_libraries

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    from skillstate.util import install_hint

    with pytest.raises(ConfigError, match=r"needs (.*, )?trl(, .*)?: " + re.escape(install_hint("train"))):
        require_training_libraries()


@pytest.mark.policy
def test_a_model_that_will_not_load_or_a_folder_that_cannot_be_written_writes_no_run(world, tmp_path):
    from skillstate.policy import PolicyTrainer

    store, model, base = world
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    before = len(store.list_runs())
    with pytest.raises(ConfigError, match="transformers cannot load it"):
        PolicyTrainer(store, "sft", source_run="bank", base_model=str(broken), run_id="b1").prepare()
    with pytest.raises(ConfigError, match="cannot write checkpoints there"):
        PolicyTrainer(store, "sft", source_run="bank", base_model=str(model), run_id="b2",
                      overrides={"policy.output_dir": "/proc/no-such-place"}).prepare()
    with pytest.raises(UserError, match="data is the source run's"):
        PolicyTrainer(store, "sft", source_run="bank", base_model=str(model), run_id="b3",
                      overrides={"data": str(tmp_path)}).prepare()
    assert len(store.list_runs()) == before


@pytest.mark.policy
def test_a_diverged_loss_stops_the_run_in_one_line_and_it_stays_resumable(world, monkeypatch):
    from skillstate.errors import EnvStop

    store, model, base = world
    real = policy_stages.train_stretch

    def diverges(**kw):
        metrics, path = real(**kw)
        return [{**m, "loss": float("nan")} if "loss" in m else m for m in metrics], path

    monkeypatch.setattr(policy_stages, "train_stretch", diverges)
    with pytest.raises(EnvStop, match="training diverged by step 2: loss not finite"):
        _train(store, "sft", "nan", model, base, **{"policy.max_steps": 2, "policy.save_steps": 2})
    assert not [e for e in _events(store, "nan") if isinstance(e, PolicyTrained)]
    assert audit(store, "nan").ok


@pytest.mark.policy
def test_sft_is_scored_at_every_validation_interval(world):
    store, model, base = world
    _train(store, "sft", "every", model, base, **{"policy.max_steps": 3, "policy.save_steps": 10,
                                                   "policy.validation_interval": 2})
    events = _events(store, "every")
    assert [v.step for v in events if isinstance(v, PolicyValidated)] == [0, 2, 3]
    assert [(t.step_from, t.step_to) for t in events if isinstance(t, PolicyTrained)] == [(0, 2), (2, 3)]
