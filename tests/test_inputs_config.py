"""Bad config and command-line values (issue 20, section 5): each is refused
in one line on stderr with exit code 2, no traceback, before a run exists
(the database holds no run afterwards), and quickly (no hang).

1. refused inputs that used to leave a run behind; 2. values that used to be
accepted; 3. empty strings that meant "not set"; 4. inputs that hung (a FIFO,
a YAML alias bomb); 5. nesting that raised RecursionError; 6. messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from skillstate.cli.main import cli
from skillstate.config import SkillConfig
from skillstate.config_section import leaf_types
from skillstate.config_views import config_keys, validate_config
from skillstate.engine.runner import create_run, dataset_of, load_run
from skillstate.errors import ConfigError
from skillstate.storage.store import Store
from skillstate.trainer import Trainer


def run_ids(db: Path) -> list[str]:
    if not db.exists():
        return []
    res = CliRunner().invoke(cli, ["runs", "--json", "--db", f"sqlite:///{db}"])
    assert res.exit_code == 0, res.output
    return [row["run_id"] for row in json.loads(res.stdout)]


def refused(db: Path, *args: str, match: str, env: dict[str, str] | None = None) -> str:
    """Exit code 2, one `Error:` line on stderr holding `match`, nothing on
    stdout, no traceback, and no run added to `db`."""
    before = run_ids(db)
    res = CliRunner().invoke(cli, [*args, "--db", f"sqlite:///{db}"], env=env)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr[:2000]
    assert res.stdout == "", res.stdout[:2000]
    assert match in lines[0], lines[0]
    assert run_ids(db) == before
    return lines[0]


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture(scope="module")
def parent(tmp_path_factory) -> Path:
    """A database holding one finished one-step run `p` to fork and evaluate next to."""
    db = tmp_path_factory.mktemp("parent") / "runs.db"
    Trainer(SkillConfig(num_epochs=1, batch_size=120, eval_test=False), db=f"sqlite:///{db}", run_id="p").train()
    return db


# 1. refused inputs leave no run behind

LEFTOVERS = {
    "nan price": (["--set", 'prices={"sim-target": [.nan, 1]}'], {}, "finite number"),
    "infinite price": (["--set", 'prices={"sim-optimizer": [1, .inf]}'], {}, "finite number"),
    "bad lease ttl": ([], {"SKILLSTATE_LEASE_TTL": "abc"}, "$SKILLSTATE_LEASE_TTL"),
    "lease ttl zero": ([], {"SKILLSTATE_LEASE_TTL": "0"}, "$SKILLSTATE_LEASE_TTL"),
    "bad host id": ([], {"SKILLSTATE_HOST_ID": "a:b"}, "$SKILLSTATE_HOST_ID"),
}


@pytest.mark.parametrize("args,env,match", LEFTOVERS.values(), ids=LEFTOVERS.keys())
def test_a_refused_run_leaves_no_run(db, args, env, match):
    refused(db, "run", "--epochs", "1", *args, match=match, env=env)


@pytest.mark.parametrize("args,env,match", LEFTOVERS.values(), ids=LEFTOVERS.keys())
def test_a_refused_eval_leaves_no_run(db, tmp_path, args, env, match):
    skill = tmp_path / "skill.md"
    skill.write_text("# Skill\nAnswer briefly.\n", encoding="utf-8")
    refused(db, "eval", "--skill", str(skill), *args, match=match, env=env)


@pytest.mark.parametrize("env", [{"SKILLSTATE_LEASE_TTL": "abc"}, {"SKILLSTATE_HOST_ID": "a:b"}],
                         ids=["lease ttl", "host id"])
def test_a_refused_fork_leaves_no_run(parent, env):
    refused(parent, "fork", "p", "1", "--epochs", "2", match="$SKILLSTATE_", env=env)
    assert run_ids(parent) == ["p"]


# 2. values that must be refused

ACCEPTED = {
    "negative price": (["--set", 'prices={"sim-target": [-1, 0.6]}'], "0 or more"),
    "num_epochs true": (["--set", "num_epochs=true"], "num_epochs: expected a number, got true"),
    "batch_size false": (["--set", "batch_size=false"], "batch_size: expected a number, got false"),
    "temperature true": (["--set", "target.temperature=true"], "target.temperature: expected a number"),
    "max cost nan": (["--max-cost-usd", "nan"], "max_cost_usd: Input should be a finite number"),
    "wall seconds inf": (["--set", "max_wall_seconds=.inf"], "max_wall_seconds: Input should be a finite number"),
    "target_score 2": (["--set", "target_score=2"], "target_score"),
    "target_score -0.1": (["--set", "target_score=-0.1"], "target_score"),
    "empty inline prompt": (["--set", "prompts.failure_analyst="], "failure_analyst: must not be empty"),
    "unknown train split": (["--set", "train_split=training"], "train_split 'training'"),
    "unknown test split": (["--set", "test_split=holdout"], "test_split 'holdout'"),
}


@pytest.mark.parametrize("args,match", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_values_out_of_range_are_refused(db, args, match):
    refused(db, "run", "--epochs", "1", *args, match=match)


def test_an_empty_prompt_file_is_refused(db, tmp_path):
    (tmp_path / "empty.md").write_text("\n", encoding="utf-8")
    refused(db, "run", "--set", f"prompts.failure_analyst={tmp_path / 'empty.md'}", match="is empty")


def test_the_bundled_world_serves_its_splits_by_name(tmp_path):
    """`val_split: test` names the bundled test split, not the second split generated."""
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    run = create_run(store, SkillConfig(num_epochs=1, val_split="test", test_split="val"))
    splits = dataset_of(store, load_run(store, run).state)
    assert {name: items[0]["id"].split("-")[0] for name, items in splits.items()} == {
        "train": "train", "val": "val", "test": "test"}
    store.close()


def field_kinds(key: str) -> set:
    """The scalar types the annotation of a flattened config key admits."""
    model = SkillConfig
    *sections, name = key.split(".")
    for part in sections:
        model = model.model_fields[part].annotation
    return leaf_types(model.model_fields[name].annotation)


def config_with(key: str, value) -> dict:
    data: dict = {}
    *sections, name = key.split(".")
    node = data
    for part in sections:
        node = node.setdefault(part, {})
    node[name] = value
    return data


NUMBER_KEYS = [k for k in config_keys() if field_kinds(k) & {int, float} and bool not in field_kinds(k)]


@pytest.mark.parametrize("key", NUMBER_KEYS)
def test_no_number_takes_a_boolean(key):
    with pytest.raises(ConfigError, match=f"{key}: .*expected a number, got true"):
        validate_config(config_with(key, True))


def test_the_number_keys_are_the_expected_ones():
    assert {"num_epochs", "seed", "target_score", "max_cost_usd", "target.max_tokens", "prices",
            "episode.max_turns", "bank.top_k"} <= set(NUMBER_KEYS)


# 3. an empty string is never "not set"

# (extra_body is a mapping of request fields: an empty string there is refused as no mapping.)
STRING_KEYS = [k for k in config_keys()
               if str in field_kinds(k) and not k.startswith("env_config") and not k.endswith("extra_body")]


@pytest.mark.parametrize("key", STRING_KEYS)
@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
def test_every_string_key_refuses_an_empty_string(key, value):
    with pytest.raises(ConfigError, match=f"{key}: must not be empty"):
        validate_config(config_with(key, value))


def test_the_string_keys_are_the_expected_ones():
    assert {"data", "stop_file", "initial_skill", "target.model", "target.api_key_env", "optimizer.base_url",
            "env", "train_split", "ray_address", "bank.trajectories", "backend"} <= set(STRING_KEYS)


EMPTY = {
    "--model": (["run", "--model", ""], "optimizer.model: must not be empty"),
    "--optimizer-model": (["run", "--optimizer-model", ""], "optimizer.model: must not be empty"),
    "--target-model": (["run", "--target-model", ""], "target.model: must not be empty"),
    "--base-url": (["run", "--base-url", ""], ".base_url: must not be empty"),
    "--data": (["run", "--data", ""], "data: must not be empty"),
    "--config": (["run", "--config", ""], "config file name is empty"),
    "eval --config": (["eval", "--skill", "s.md", "--config", " "], "config file name is empty"),
    "--set data=": (["run", "--set", "data="], "data: must not be empty"),
    "--set stop_file=": (["run", "--set", "stop_file="], "stop_file: must not be empty"),
    "--set target.api_key_env=": (["run", "--set", "target.api_key_env="], "target.api_key_env: must not be empty"),
    "--set initial_skill=": (["run", "--set", "initial_skill= "], "initial_skill: must not be empty"),
    "eval --model": (["eval", "--skill", "s.md", "--model", ""], "target.model: must not be empty"),
}


@pytest.mark.parametrize("args,match", EMPTY.values(), ids=EMPTY.keys())
def test_an_empty_value_is_refused(db, tmp_path, monkeypatch, args, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.md").write_text("# Skill\n", encoding="utf-8")
    refused(db, *args, match=match)
    assert not db.exists()  # refused before the database is opened


def test_a_config_file_with_an_empty_string_is_refused(db, tmp_path):
    (tmp_path / "c.yaml").write_text('target:\n  model: ""\n', encoding="utf-8")
    refused(db, "run", "--config", str(tmp_path / "c.yaml"), match="target.model: must not be empty")


# 4. no hangs: files that are not regular files, YAML alias bombs; 5. deep nesting is one line

def cli_process(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real command in its own process, so that a hang fails the test instead of stopping the suite."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLSTATE_")}
    return subprocess.run([sys.executable, "-m", "skillstate.cli.main", *args, "--db", f"sqlite:///{cwd / 'x.db'}"],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def assert_one_line(res: subprocess.CompletedProcess, match: str, cwd: Path) -> None:
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and match in lines[0], res.stderr[-2000:]
    assert res.stdout == ""
    assert run_ids(cwd / "x.db") == []


@pytest.fixture
def fifo(tmp_path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def _data_with_fifo(tmp_path: Path, fifo: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for split in ("val", "test"):
        (data / f"{split}.jsonl").write_text((EXAMPLES / "qa" / f"{split}.jsonl").read_text(encoding="utf-8"))
    fifo.rename(data / "train.jsonl")
    return data


FIFOS = {
    "config": lambda tmp, fifo: ["run", "--config", str(fifo)],
    "initial skill": lambda tmp, fifo: ["run", "--set", f"initial_skill={fifo}"],
    "eval skill": lambda tmp, fifo: ["eval", "--skill", str(fifo)],
    "data file": lambda tmp, fifo: ["run", "--data", str(_data_with_fifo(tmp, fifo))],
    "prompt file": lambda tmp, fifo: ["run", "--set",
                                      f"prompts.failure_analyst={fifo.rename(fifo.with_suffix('.md'))}"],
}


@pytest.mark.parametrize("make_args", FIFOS.values(), ids=FIFOS.keys())
def test_a_fifo_is_refused_not_read(tmp_path, fifo, make_args):
    res = cli_process(*make_args(tmp_path, fifo), cwd=tmp_path)
    assert_one_line(res, "named pipe (FIFO), not a regular file", tmp_path)


def test_a_directory_as_skill_is_refused(db, tmp_path):
    (tmp_path / "skill").mkdir()
    refused(db, "run", "--set", f"initial_skill={tmp_path / 'skill'}", match="SKILL.md is missing")


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def test_a_yaml_alias_bomb_in_a_config_file_is_refused_quickly(tmp_path):
    (tmp_path / "bomb.yaml").write_text(LAUGHS, encoding="utf-8")
    res = cli_process("run", "--config", str(tmp_path / "bomb.yaml"), cwd=tmp_path, timeout=30)
    assert_one_line(res, "more than 100,000 values", tmp_path)


def test_a_yaml_alias_bomb_in_env_config_is_refused_quickly(tmp_path):
    text = "env_config:\n" + "".join(f"  {line}\n" for line in LAUGHS.splitlines())
    (tmp_path / "bomb.yaml").write_text(text, encoding="utf-8")
    res = cli_process("run", "--config", str(tmp_path / "bomb.yaml"), cwd=tmp_path, timeout=30)
    assert_one_line(res, "more than 100,000 values", tmp_path)


def test_a_recursive_yaml_alias_is_refused(db, tmp_path):
    (tmp_path / "loop.yaml").write_text("env_config: &x {a: *x}\n", encoding="utf-8")
    refused(db, "run", "--config", str(tmp_path / "loop.yaml"), match="nested more than")


DEEP = 5000
NESTED = {
    "yaml": ("c.yaml", f"env_config:\n  x: {'[' * DEEP}{']' * DEEP}\n"),
    "json as yaml": ("c.yaml", '{"env_config": {"x": ' + "[" * DEEP + "]" * DEEP + "}}\n"),
    "toml": ("c.toml", f"[env_config]\nx = {'[' * DEEP}{']' * DEEP}\n"),
    "yaml, within the recursion limit": ("c.yaml", f"env_config:\n  x: {'[' * 200}{']' * 200}\n"),
}


@pytest.mark.parametrize("name,text", NESTED.values(), ids=NESTED.keys())
def test_deeply_nested_config_is_one_line(db, tmp_path, name, text):
    (tmp_path / name).write_text(text, encoding="utf-8")
    refused(db, "run", "--config", str(tmp_path / name), match="nested")


def test_deeply_nested_set_value_is_one_line(db):
    refused(db, "run", "--set", f"env_config={'[' * DEEP}{']' * DEEP}", match="--set env_config: values nested")


@pytest.mark.parametrize("layout", ["jsonl", "json array"])
def test_deeply_nested_data_is_one_line(db, tmp_path, layout):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("val", "test"):
        (data / f"{split}.jsonl").write_text((EXAMPLES / "qa" / f"{split}.jsonl").read_text(encoding="utf-8"))
    deep = '{"id": "d1", "question": "q", "answers": ["a"], "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (data / "train.jsonl").write_text(deep + "\n" if layout == "jsonl" else f"[{deep}]\n", encoding="utf-8")
    refused(db, "run", "--data", str(data), match="nested too deeply")


# 6. messages

@pytest.mark.parametrize("section,first", [("target", "model"), ("optimizer", "model"), ("episode", "max_turns"),
                                           ("bank", "retrieval")])
def test_a_section_is_named_as_a_section(db, section, first):
    line = refused(db, "run", "--set", f"{section}=1", match=f"'{section}' is a section")
    assert f"--set {section}.{first}=" in line and "did you mean" not in line


def test_a_section_in_a_config_file_is_named_as_a_section(db, tmp_path):
    (tmp_path / "c.yaml").write_text("target: gpt-4o\n", encoding="utf-8")
    refused(db, "run", "--config", str(tmp_path / "c.yaml"), match="'target' is a section")


BIG = 1_000_000  # (the sweep used 5 MB; 1 MB shows the same, faster)


@pytest.mark.parametrize("name,text", [("c.yaml", f"gate_metric: {'y' * BIG}\n"),
                                       ("c.yaml", f'num_epochs: "{"9" * BIG}"\n'),
                                       ("c.toml", f'"{"k" * BIG}" = 1\n'),  # (YAML keys are 1024 characters at most)
                                       ("c.toml", f'[prompts]\n"{"p" * BIG}" = "x"\n')],
                         ids=["choice", "quoted number", "unknown key", "unknown prompt"])
def test_a_huge_value_in_a_config_file_makes_a_short_line(db, tmp_path, name, text):
    (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "s.md").write_text("# Skill\n", encoding="utf-8")
    line = refused(db, "eval", "--skill", str(tmp_path / "s.md"), "--config", str(tmp_path / name), match="")
    assert len(line) < 600 and "characters cut" in line or len(line) < 200, line[:1000]


def test_a_huge_option_value_makes_a_short_line(db):
    res = CliRunner().invoke(cli, ["run", "--epochs", "x" * 100_000, "--db", f"sqlite:///{db}"])
    assert res.exit_code == 2
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("Error: ")]
    assert len(line) < 600 and "characters cut" in line and line.endswith("is not a valid integer."), line[:1000]
    assert not db.exists()


# older logs: a config stored before these checks still resumes and verifies

def test_a_run_stored_before_the_checks_still_resumes_and_verifies(tmp_path):
    """A log written by an older version may hold values refused now (an empty
    stop_file, target_score 2, a negative price): it is read back as it was."""
    from skillstate.reading.audit import verify
    from skillstate.storage.store import GENESIS

    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    template = store.read_events(create_run(store, SkillConfig(num_epochs=1, batch_size=120, eval_test=False),
                                            "template"))[0].event
    old = {**template.config, "stop_file": "", "target_score": 2.0, "prices": {"sim-target": [-1.0, 0.6]}}
    store.append("old", [template.model_copy(update={"config": old})], last_seq=0, last_hash=GENESIS,
                 blobs_to_put={}, new_run={"kind": "train"})
    result = Trainer(store=store, run_id="old").train()
    assert result.state.completed
    assert verify(store, "old").ok
    store.close()


def test_a_custom_backend_factory_on_ray_is_refused_before_the_run_exists(tmp_path):
    """Python API: Trainer and evaluate_skill refuse the combination before creating a run (no cluster needed)."""
    from skillstate.engine.runner import make_backend
    from skillstate.trainer import evaluate_skill

    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    with pytest.raises(ConfigError, match="custom backend factory"):
        Trainer(SkillConfig(executor="ray"), store=store, run_id="f", backend_factory=make_backend).train()
    skill = tmp_path / "skill.md"
    skill.write_text("# A skill\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="custom backend factory"):
        evaluate_skill(SkillConfig(executor="ray", initial_skill=str(skill)), store=store, backend_factory=make_backend)
    assert store.list_runs() == []
    store.close()
