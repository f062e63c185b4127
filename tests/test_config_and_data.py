"""Config loading, overrides and redaction; QA data loading and scoring."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES

from skillstate.config import redact
from skillstate.config_sources import build_config, parse_assignment
from skillstate.config_views import public_config, semantic_view
from skillstate.envs.qa import load_dataset_dir, score_answer, token_f1
from skillstate.errors import ConfigError, DataError
from skillstate.prompts import PROMPT_NAMES, resolve_prompts


def test_defaults_follow_the_spec():
    c = build_config()
    assert (c.num_epochs, c.batch_size, c.minibatch_size, c.merge_batch_size) == (4, 40, 8, 8)
    assert (c.edit_budget, c.min_edit_budget, c.lr_scheduler, c.gate_metric, c.seed) == (4, 2, "cosine", "hard", 42)
    assert c.backend == "sim" and c.model_for("target") == "sim-target"


def test_yaml_and_toml_files_then_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("num_epochs: 2\ntarget:\n  model: small\noptimizer:\n  model: big\n  temperature: 0.7\n")
    t = tmp_path / "c.toml"
    t.write_text("num_epochs = 3\ngate_metric = 'mixed'\n[target]\nmodel = 'small'\n")
    cy = build_config(y, {"num_epochs": 5, "optimizer.max_tokens": 100})
    assert cy.num_epochs == 5 and cy.target.model == "small" and cy.optimizer.temperature == 0.7
    assert cy.optimizer.max_tokens == 100 and cy.target.max_tokens == 512  # role defaults kept
    ct = build_config(t)
    assert ct.num_epochs == 3 and ct.gate_metric == "mixed"


def test_examples_config_is_valid():
    c = build_config(EXAMPLES / "openai.yaml")
    assert c.backend == "openai" and c.data


@pytest.mark.parametrize("text,expected", [
    ("num_epochs=2", ("num_epochs", 2)), ("failure_only=true", ("failure_only", True)),
    ("target.model=gpt-4o-mini", ("target.model", "gpt-4o-mini")),
    ("gate_mixed_weight=0.25", ("gate_mixed_weight", 0.25)),
    ("prompts.rank=my rank.md", ("prompts.rank", "my rank.md")),
])
def test_set_values_are_typed(text, expected):
    assert parse_assignment(text) == expected


def test_unknown_keys_suggest_the_closest():
    with pytest.raises(ConfigError, match="did you mean edit_budget"):
        build_config(overrides={"edit_budgt": 3})


def test_redaction():
    assert redact("https://alice:pw@example.com/v1") == "https://***@example.com/v1"
    # a scheme starts at the first letter of its run of scheme characters; what precedes it is kept
    assert redact("url=1-git+ssh://bob:pw@host a.b://c@d") == "url=1-git+ssh://***@host a.b://***@d"
    assert "sk-" not in redact("key sk-abcdefghijklmnop and Bearer abcdefghijklmnop")
    c = build_config(overrides={"target.base_url": "http://u:secret@h/v1"})
    assert public_config(c)["target"]["base_url"] == "http://***@h/v1"


def test_runtime_keys_are_not_part_of_the_semantic_view():
    a = public_config(build_config(overrides={"concurrency": 2, "target.base_url": "http://a/v1"}))
    b = public_config(build_config(overrides={"concurrency": 9}))
    assert semantic_view(a) == semantic_view(b)
    assert semantic_view(a) != semantic_view(public_config(build_config(overrides={"seed": 1})))


def test_prompt_overrides_from_file_or_text(tmp_path):
    f = tmp_path / "rank.md"
    f.write_text("Rank $budget edits: $edits")
    texts = resolve_prompts({"rank": str(f), "merge": "Merge these:\n$patches"})
    assert texts["rank"] == "Rank $budget edits: $edits" and texts["merge"].startswith("Merge these")
    assert set(texts) == set(PROMPT_NAMES)
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_prompts({"rank": str(tmp_path / "missing.md")})


def test_every_builtin_optimizer_prompt_states_its_json_schema():
    texts = resolve_prompts({})
    for name in ("failure_analyst", "success_analyst", "merge", "merge_final", "rank"):
        assert "Reply with JSON only" in texts[name] and "{" in texts[name]


def test_examples_dataset_loads():
    splits = load_dataset_dir(EXAMPLES / "qa", ["train", "val", "test"])
    assert sum(len(v) for v in splits.values()) >= 60
    assert all(item["task_type"] for items in splits.values() for item in items)


def test_json_arrays_are_accepted(tmp_path):
    for split in ("train", "val", "test"):
        (tmp_path / f"{split}.json").write_text(json.dumps([{"id": f"{split}1", "question": "q", "answers": ["a"]}]))
    assert load_dataset_dir(tmp_path, ["train", "val", "test"])["val"][0]["id"] == "val1"


def test_ids_must_be_unique_across_splits(tmp_path):
    for split in ("train", "val", "test"):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps({"id": "same", "question": "q", "answers": ["a"]}))
    with pytest.raises(DataError, match="more than one split"):
        load_dataset_dir(tmp_path, ["train", "val", "test"])


@pytest.mark.parametrize("prediction,answers,hard", [
    ("Paris", ["paris"], 1.0), ("The answer is 391.", ["391"], 1.0), ("3910", ["391"], 0.0),
    ("New York City", ["New York"], 1.0), ("", ["x"], 0.0), ("an apple", ["apple", "pear"], 1.0),
])
def test_hard_score_is_exact_or_substring_match(prediction, answers, hard):
    assert score_answer(prediction, answers)[0] == hard


def test_soft_score_is_token_f1():
    assert token_f1("new york city", "new york") == pytest.approx(0.8)
    assert score_answer("nope", ["yes"])[1] == 0.0
    assert score_answer("kiwi, mango", ["kiwi, mango, plum"])[1] == pytest.approx(0.8)
