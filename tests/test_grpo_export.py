"""G samples per prompt for GRPO: a sample index in the request identity (sent
as the API's seed), journaled and replayed one by one; export-grpo writes
TRL's prompt-only rows with rewards and group-relative advantages."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from skillstate.cli.main import cli
from skillstate.llm.base import ChatRequest
from skillstate.reading.audit import verify
from skillstate.storage.store import Store

MESSAGES = [{"role": "user", "content": "Question: 2 + 2?"}]


def test_a_sample_index_is_part_of_the_request_identity_only_when_set():
    plain = ChatRequest.build("sim", "m", MESSAGES, 1.0, 16)
    assert "seed" not in plain.to_dict()  # requests without samples hash as they always did
    seeds = {ChatRequest.build("sim", "m", MESSAGES, 1.0, 16, seed=i).hash for i in range(4)}
    assert len(seeds) == 4 and plain.hash not in seeds


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo")
    skill = tmp / "skill.md"
    skill.write_text("- Work it out step by step.\n", encoding="utf-8")
    db = f"sqlite:///{tmp / 'g.db'}"
    args = ["eval", "--skill", str(skill), "--split", "val", "--samples", "4", "--set", "target.temperature=1.0",
            "--db", db, "-q"]
    first = CliRunner().invoke(cli, [*args, "--run-id", "g"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(cli, [*args, "--run-id", "g2"])  # the same requests: served from the journal
    assert again.exit_code == 0, again.output
    return tmp, db


def test_samples_are_distinct_journaled_requests(sampled):
    _, db = sampled
    store = Store(db)
    calls = store.read_calls("g")
    assert len(calls) == 60 * 4 and len({c.request_hash for c in calls}) == len(calls)
    assert store.read_calls("g2") == []  # replayable: nothing sent twice
    report = verify(store, "g")
    assert report.ok and report.checked == report.total


def test_export_grpo_rows(sampled):
    tmp, db = sampled
    out = tmp / "grpo.jsonl"
    res = CliRunner().invoke(cli, ["export-grpo", "g", "--db", db, "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 60 and "wrote 60 groups" in res.output
    varied = 0
    for row in rows:
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert len(row["sampled_completions"]) == len(row["rewards"]) == len(row["advantages"]) == 4
        assert abs(sum(row["advantages"])) < 1e-9 and all(math.isfinite(a) for a in row["advantages"])
        if len(set(row["rewards"])) == 1:
            assert row["advantages"] == [0.0] * 4  # equal rewards: zeros, never NaN
        else:
            varied += 1
    assert varied, "no group had samples that disagreed"
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(out))["train"]
    assert loaded.column_names == ["prompt", "task_id", "category", "sampled_completions", "rewards", "advantages"]


def test_export_grpo_needs_a_sampled_evaluation_run(sampled, finished_run):
    store, _, _ = finished_run
    res = CliRunner().invoke(cli, ["export-grpo", "base", "--db", store.display_url, "-o", "/tmp/x.jsonl"])
    assert res.exit_code == 2 and "--samples 4" in res.output
