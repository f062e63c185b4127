"""Data and config inputs: the rough edges a new user hits. Every bad input is
one clear line and exit code 2; a config file's paths are relative to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from skillstate.cli.main import cli
from skillstate.config_sources import build_config
from skillstate.engine.runner import load_run
from skillstate.envs.qa import load_dataset_dir
from skillstate.errors import ConfigError
from skillstate.storage.store import open_store

BOM = "\ufeff"
SPLITS = ["train", "val", "test"]


def item(i: str) -> dict:
    return {"id": i, "question": f"question {i}?", "answers": ["x"]}


def data_dir(root: Path, sizes: tuple[int, int, int] = (1, 1, 1)) -> Path:
    """A valid dataset: one JSONL file per split."""
    root.mkdir(parents=True, exist_ok=True)
    for split, n in zip(SPLITS, sizes, strict=True):
        (root / f"{split}.jsonl").write_text("".join(json.dumps(item(f"{split}-{k}")) + "\n" for k in range(n)))
    return root


def example_data(root: Path) -> Path:
    """A small copy of examples/qa: 12 train, 8 val and 8 test items."""
    root.mkdir(parents=True)
    for split, n in zip(SPLITS, (12, 8, 8), strict=True):
        lines = (EXAMPLES / "qa" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()[:n]
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def user_error(tmp_path: Path, *args: str, match: str, no_db_file: bool = False) -> str:
    """Exit code 2, one `Error:` line holding `match`, no traceback, no run written."""
    db = tmp_path / f"x{len(list(tmp_path.glob('x*.db')))}.db"
    res = CliRunner().invoke(cli, [*args, "--db", f"sqlite:///{db}"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert "Traceback" not in res.output
    assert match in lines[0], lines[0]
    if no_db_file:
        assert not db.exists()
    elif db.exists():  # `run` opens the database before it reads its config
        runs = CliRunner().invoke(cli, ["runs", "--json", "--db", f"sqlite:///{db}"])
        assert json.loads(runs.output) == []
    return lines[0]


def config_error(tmp_path: Path, *args: str, match: str) -> str:
    """Through `eval`, which reads its config before it opens the database: no database file at all."""
    skill = tmp_path / "skill.md"
    skill.write_text("# Skill\n")
    return user_error(tmp_path, "eval", "--skill", str(skill), *args, match=match, no_db_file=True)


# 1. the line of a malformed line


def test_malformed_jsonl_names_the_line(tmp_path):
    data = data_dir(tmp_path / "data")
    good = "".join(json.dumps(item(f"a{k}")) + "\n" for k in range(2))
    (data / "train.jsonl").write_text(good + "\n" + '{"id": "b", "question": oops}\n')
    line = user_error(tmp_path, "run", "--data", str(data), match="train.jsonl: not valid JSON (line 4: ")
    assert "Expecting value" in line


def test_malformed_json_array_names_the_line(tmp_path):
    data = data_dir(tmp_path / "data")
    (data / "val.jsonl").unlink()
    (data / "val.json").write_text('[\n  {"id": "v1", "question": "q?", "answers": ["x"]},\n  {"id": "v2",,}\n]\n')
    user_error(tmp_path, "run", "--data", str(data), match="val.json: not valid JSON (line 3: ")


# 2. a UTF-8 BOM


def test_data_files_with_a_bom_load(tmp_path):
    data = data_dir(tmp_path / "data", (2, 1, 1))
    train = data / "train.jsonl"
    train.write_text(BOM + train.read_text(), encoding="utf-8")
    (data / "val.jsonl").unlink()
    (data / "val.json").write_text(BOM + json.dumps([item("v1"), item("v2")], indent=2), encoding="utf-8")
    splits = load_dataset_dir(data, SPLITS)
    assert [i["id"] for i in splits["train"]] == ["train-0", "train-1"]
    assert [i["id"] for i in splits["val"]] == ["v1", "v2"]


def test_config_files_with_a_bom_load(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text(BOM + "num_epochs: 2\ngate_metric: mixed\n", encoding="utf-8")
    t = tmp_path / "c.toml"
    t.write_text(BOM + "num_epochs = 3\n[target]\nmodel = 'small'\n", encoding="utf-8")
    assert build_config(y).gate_metric == "mixed"
    ct = build_config(t)
    assert ct.num_epochs == 3 and ct.target.model == "small"


# 3. --data names a file


def test_data_that_is_a_file(tmp_path):
    file = data_dir(tmp_path / "data") / "train.jsonl"
    line = user_error(tmp_path, "run", "--data", str(file), match=f"data path {file} is a file")
    assert "expected a directory holding train.jsonl, val.jsonl, test.jsonl" in line
    assert "does not exist" not in line
    user_error(tmp_path, "eval", "--skill", str(file), "--data", str(file), match="is a file")


# 4. an object where an array was expected


@pytest.mark.parametrize("name,text", [
    ("train.json", json.dumps(item("a"))),
    ("train.json", json.dumps(item("a"), indent=2)),
    ("train.jsonl", json.dumps(item("a"), indent=2)),
])
def test_an_object_instead_of_an_array(tmp_path, name, text):
    data = data_dir(tmp_path / "data")
    (data / "train.jsonl").unlink()
    (data / name).write_text(text + "\n")
    line = user_error(tmp_path, "run", "--data", str(data), match=f"{name}: holds a single JSON object")
    assert "expected a JSON array" in line


def test_one_line_jsonl_with_one_object_is_fine(tmp_path):
    data = data_dir(tmp_path / "data")
    assert len(load_dataset_dir(data, SPLITS)["train"]) == 1


# 5. both split.json and split.jsonl


def test_json_and_jsonl_of_one_split_are_ambiguous(tmp_path):
    data = data_dir(tmp_path / "data")
    (data / "test.json").write_text(json.dumps([item("t")]))
    user_error(tmp_path, "run", "--data", str(data), match="both test.jsonl and test.json exist")


# 6. paths in a config file are relative to it


def write_config(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "skill.md").write_text("# My skill\n\nAnswer briefly.\n")
    (folder / "rank.md").write_text("Rank $budget edits: $edits")
    config = folder / "conf.yaml"
    config.write_text(text)
    return config


def test_config_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    folder = tmp_path / "project" / "configs"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = write_config(folder, (
        "data: ../qa\ninitial_skill: skill.md\n"
        "prompts:\n  rank: rank.md\n  merge: Merge these patches, keep it short.\n"
        f"  qa_user: {folder / 'rank.md'}\n"
    ))
    monkeypatch.chdir(elsewhere)
    c = build_config(Path("..") / "project" / "configs" / "conf.yaml")
    assert c.data == str(tmp_path / "project" / "qa")
    assert c.initial_skill == str(folder / "skill.md")
    assert c.prompts == {"rank": str(folder / "rank.md"), "merge": "Merge these patches, keep it short.",
                         "qa_user": str(folder / "rank.md")}
    # the command line and --set are relative to the current directory, as before
    c = build_config(config, {"data": "mine", "initial_skill": "s.md", "prompts.rank": "r.md"})
    assert (c.data, c.initial_skill, c.prompts["rank"]) == ("mine", "s.md", "r.md")


def test_a_config_elsewhere_runs_from_any_directory(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    example_data(folder / "qa")
    config = write_config(folder, "backend: sim\ndata: qa\ninitial_skill: skill.md\nnum_epochs: 3\n")
    db = tmp_path / "run.db"
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["run", "--config", "exp/conf.yaml", "--set", "num_epochs=1", "--batch-size", "12",
                                   "-q", "--run-id", "r", "--db", f"sqlite:///{db}"])
    assert res.exit_code == 0, res.output
    state = load_run(open_store(f"sqlite:///{db}"), "r").state
    assert state.config["data"] == str(folder / "qa")  # recorded as an absolute path
    assert state.config["initial_skill"] == str(folder / "skill.md")
    assert state.config["num_epochs"] == 1
    # a missing file names the path it looked for
    (folder / "conf.yaml").write_text("data: nowhere\n")
    user_error(tmp_path, "run", "--config", str(config), match=f"data directory {folder / 'nowhere'} does not exist")


def test_examples_config_reaches_its_dataset():
    assert build_config(EXAMPLES / "openai.yaml").data == str(EXAMPLES / "qa")


# 7. strict types in config files


@pytest.mark.parametrize("name,text,key,shown", [
    ("c.toml", 'num_epochs = "1"\n', "num_epochs", "got the string '1' (write it without quotes)"),
    ("c.yaml", 'use_gate: "yes"\n', "use_gate", "got the string 'yes'"),
    ("c.yaml", "target:\n  temperature: '0.5'\n", "target.temperature", "valid number"),
    ("c.toml", "[prices]\ngpt-x = [1.0, '2']\n", "prices.gpt-x.1", "valid number"),
    ("c.yaml", "num_epochs: true\n", "num_epochs", "got True"),
])
def test_config_file_values_have_strict_types(tmp_path, name, text, key, shown):
    file = tmp_path / name
    file.write_text(text)
    line = config_error(tmp_path, "--config", str(file), match=f"invalid config value for {key} in {file}: ")
    assert shown in line


def test_set_values_keep_working(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('num_epochs = "1"\n')
    with pytest.raises(ConfigError, match="num_epochs"):
        build_config(file)
    c = build_config(overrides={"num_epochs": 1, "use_gate": False, "prices": {"m": [1, 2]}})
    assert (c.num_epochs, c.use_gate, c.prices) == (1, False, {"m": (1.0, 2.0)})


def test_valid_config_files_still_load(tmp_path):
    t = tmp_path / "c.toml"
    t.write_text("num_epochs = 2\ngate_mixed_weight = 1\nuse_gate = false\nmax_cost_usd = 5\n"
                 "[target]\ntemperature = 0\n[prices]\nm = [1, 2.5]\n[prompts]\nmerge = 'Merge: $patches'\n")
    c = build_config(t)
    assert (c.num_epochs, c.gate_mixed_weight, c.use_gate, c.max_cost_usd) == (2, 1.0, False, 5.0)
    assert c.target.temperature == 0.0 and c.prices == {"m": (1.0, 2.5)}
    y = tmp_path / "c.yaml"
    y.write_text("target:\n  temperature: null\n  model: m\nprices:\n  m: [0.15, 0.6]\nseed: 7\n")
    assert build_config(y).target.temperature is None
    assert build_config(EXAMPLES / "openai.yaml").num_epochs == 3


# 8. a cap on num_epochs


def test_num_epochs_is_capped(tmp_path):
    assert build_config(overrides={"num_epochs": 100_000}).num_epochs == 100_000
    user_error(tmp_path, "run", "--epochs", "100001", match="num_epochs: Input should be less than or equal to 100000")
    file = tmp_path / "c.toml"
    file.write_text("num_epochs = 1_000_000\n")
    config_error(tmp_path, "--config", str(file), match="invalid config value for num_epochs")


def test_a_binary_config_file_is_one_line_not_a_traceback(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_bytes(bytes([0x81, 0xFF, 0x00, 0x13]) * 20)
    user_error(tmp_path, "run", "--config", str(config), match="is not UTF-8 text (byte 0)", no_db_file=True)
    user_error(tmp_path, "eval", "--skill", str(config), "--config", str(config), match="is not UTF-8 text",
               no_db_file=True)
