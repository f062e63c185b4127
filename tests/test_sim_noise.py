"""The sim's noisy mode (`sim.*`): each knob does what it says, replies stay
a function of the request (so noisy runs replay and verify exactly), and
with every knob off the sim is the one it always was."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import small_config

from skillstate.cli.main import cli
from skillstate.config import SkillConfig
from skillstate.config_sources import build_config
from skillstate.config_views import validate_config
from skillstate.engine.runner import lineage_events
from skillstate.errors import ConfigError
from skillstate.reading.audit import verify
from skillstate.sim.backend import SimBackend
from skillstate.sim.noise import MODERATE, SimNoise
from skillstate.sim.optimizer import SimOptimizer
from skillstate.sim.world import RULES, SimWorld, bundled_skill, bundled_splits
from skillstate.trainer import Trainer

ITEMS = [i for items in bundled_splits().values() for i in items]
TYPES = sorted(RULES)
ALL_RULES = bundled_skill().replace("- Always answer with a single word.\n", "") + "".join(
    f"- {RULES[t].variants[0]}\n" for t in TYPES)


def _ask(world: SimWorld, skill: str, item: dict) -> str:
    backend = SimBackend(world)
    messages = [{"role": "system", "content": skill}, {"role": "user", "content": f"Question: {item['question']}"}]
    return backend.respond(messages).text


def _accuracy(world: SimWorld, skill: str, task_type: str | None = None) -> float:
    items = [i for i in ITEMS if task_type is None or i["task_type"] == task_type]
    return statistics.mean(_ask(world, skill, i) == i["answers"][0] for i in items)


# -- the target ---------------------------------------------------------------------------------


def test_the_same_request_gets_the_same_reply_and_a_one_word_change_draws_again():
    noisy = SimWorld(ITEMS, SimNoise(answer_noise=1.0))
    clean = SimWorld(ITEMS)
    skill, reworded = bundled_skill(), bundled_skill().replace("short questions", "brief questions")
    assert [_ask(noisy, skill, i) for i in ITEMS] == [_ask(noisy, skill, i) for i in ITEMS]
    assert [_ask(SimWorld(ITEMS, SimNoise(answer_noise=1.0)), skill, i) for i in ITEMS] == \
        [_ask(noisy, skill, i) for i in ITEMS]  # a function of the request, not of the process
    # the clean target answers both skills alike (neither states a rule); the noisy one draws again
    assert [_ask(clean, skill, i) for i in ITEMS] == [_ask(clean, reworded, i) for i in ITEMS]
    changed = sum(_ask(noisy, skill, i) != _ask(noisy, reworded, i) for i in ITEMS)
    assert changed >= len(ITEMS) // 10
    # the chance of a right answer is what it was: only the draw moved
    assert abs(_accuracy(noisy, ALL_RULES) - _accuracy(clean, ALL_RULES)) < 0.06


def test_with_every_knob_off_the_world_answers_as_before():
    off = SimWorld(ITEMS, SimNoise.of(SkillConfig().sim))
    assert not SimNoise.of(SkillConfig().sim).on and off.cross_harms == ()
    for skill in (bundled_skill(), ALL_RULES):
        assert [_ask(off, skill, i) for i in ITEMS] == [_ask(SimWorld(ITEMS), skill, i) for i in ITEMS]
    assert SkillConfig().model_for("target") == "sim-target"
    assert SkillConfig().model_for("optimizer") == "sim-optimizer"


def test_a_harmful_rule_lowers_the_task_type_it_breaks_and_only_that():
    world = SimWorld(ITEMS, SimNoise(harmful_edits=0.5, harm_factor=0.35))
    assert {t.aimed for t in world.cross_harms} == set(TYPES)
    for trap in world.cross_harms:
        skill = ALL_RULES + f"- {trap.text}\n"
        assert trap.breaks != trap.aimed
        assert world.chance(skill, trap.breaks) == pytest.approx(0.35 * world.chance(ALL_RULES, trap.breaks))
        for other in (t for t in TYPES if t != trap.breaks):
            assert world.chance(skill, other) == world.chance(ALL_RULES, other)
        # the trap that rides on its type's right rule lifts that type while it breaks another
        if RULES[trap.aimed].key in trap.text.lower():
            assert world.chance(bundled_skill() + f"- {trap.text}\n", trap.aimed) > \
                world.chance(bundled_skill(), trap.aimed)
        # scored as the target answers, the broken type does worse
        assert _accuracy(world, skill, trap.breaks) < _accuracy(world, ALL_RULES, trap.breaks) - 0.3
    # with the knob off the same line is harmless
    trap = world.cross_harms[0]
    assert SimWorld(ITEMS).chance(ALL_RULES + f"- {trap.text}\n", trap.breaks) == \
        SimWorld(ITEMS).chance(ALL_RULES, trap.breaks)


def test_a_long_skill_costs_accuracy():
    world = SimWorld(ITEMS, SimNoise(length_penalty=0.05, length_free_chars=600))
    padded = ALL_RULES + "".join(f"- Stay focused on question number {n} and the ones like it.\n" for n in range(12))
    assert len(ALL_RULES) <= 700 < len(padded)
    for task_type in TYPES:
        assert world.chance(padded, task_type) < world.chance(ALL_RULES, task_type)
        assert SimWorld(ITEMS).chance(padded, task_type) == SimWorld(ITEMS).chance(ALL_RULES, task_type)
    assert _accuracy(world, padded) < _accuracy(world, ALL_RULES) - 0.2
    assert SimNoise(length_penalty=0.05).length_factor("x" * 100) == 1.0


# -- the optimizer --------------------------------------------------------------------------------


def _proposals(noise: SimNoise, skill: str, n: int = 400) -> list[dict]:
    optimizer = SimOptimizer(SimWorld(ITEMS, noise))
    out = []
    for k in range(n):
        edit = optimizer._propose(skill, TYPES[k % len(TYPES)], random.Random(k), set())
        if edit is not None:
            out.append(edit)
    return out


def test_the_optimizer_proposes_harmful_rules_and_paraphrases_only_in_the_noisy_mode():
    noise = SimNoise(harmful_edits=0.3, paraphrases=0.3)
    world = SimWorld(ITEMS, noise)
    half = bundled_skill() + "".join(f"- {RULES[t].variants[0]}\n" for t in TYPES[:3])
    proposed = [e["content"].removeprefix("- ") for e in _proposals(noise, half)]
    traps = [c for c in proposed if any(t.text == c for t in world.cross_harms)]
    paraphrases = [c for c in proposed if c not in half and any(
        RULES[t].key in c.lower() and RULES[t].key in half.lower() for t in TYPES)
        and not any(t.key in c.lower() for t in world.cross_harms)]
    assert len(traps) >= 60 and len(paraphrases) >= 40
    clean = [e["content"].removeprefix("- ") for e in _proposals(SimNoise(), half)]
    assert not any(t.text == c for c in clean for t in world.cross_harms)


def test_a_paraphrase_changes_no_items_chance():
    noise = SimNoise(harmful_edits=0.3, paraphrases=1.0)
    world = SimWorld(ITEMS, noise)
    optimizer = SimOptimizer(world)
    skill = bundled_skill() + "".join(f"- {RULES[t].variants[0]}\n" for t in TYPES[:4])
    seen = set()
    for k in range(60):
        edit = optimizer._paraphrase(skill, random.Random(k))
        assert edit is not None and edit["content"] not in skill
        longer = skill + edit["content"] + "\n"
        seen.add(edit["content"])
        assert all(world.chance(longer, t) == world.chance(skill, t) for t in TYPES)
    assert len(seen) >= 4
    assert optimizer._paraphrase(bundled_skill(), random.Random(0)) is None  # no rule to restate


def _rank_correlation(noise: SimNoise, trials: int = 600) -> float:
    optimizer = SimOptimizer(SimWorld(ITEMS, noise))
    rules = [RULES[t].variants[0] for t in TYPES[:3]]
    pool = [{"index": i, "op": "insert_after", "target": "## Rules", "content": f"- {text}"}
            for i, text in enumerate(rules + ["Keep answers short.", "Be helpful, polite and precise.",
                                              "Answer as fast as possible, without checking your work."])]
    values, picked = [], []
    for k in range(trials):
        reply = optimizer._rank(pool, 3, random.Random(k))
        if not reply.startswith("{"):  # now and then the ranker replies in prose
            continue
        chosen = set(json.loads(reply)["selected_indices"])
        for edit in pool:
            values.append(optimizer._value(edit))
            picked.append(1.0 if edit["index"] in chosen else 0.0)
    return statistics.correlation(values, picked)


def test_an_uninformative_ranking_is_uncorrelated_with_the_edits_value():
    assert _rank_correlation(SimNoise()) > 0.4
    assert abs(_rank_correlation(SimNoise(rank_noise=1.0))) < 0.08
    assert _rank_correlation(SimNoise(rank_noise=0.8)) < _rank_correlation(SimNoise()) - 0.2


# -- config and runs ---------------------------------------------------------------------------------


def test_the_moderate_preset_sets_every_knob_and_explicit_values_win():
    cfg = build_config(overrides={"sim.noise": "moderate", "sim.rank_noise": 0.0})
    assert cfg.sim.rank_noise == 0.0
    assert {k: getattr(cfg.sim, k) for k in MODERATE if k != "rank_noise"} == \
        {k: v for k, v in MODERATE.items() if k != "rank_noise"}
    assert cfg.model_for("target").startswith("sim-target-noisy-")
    stored = validate_config(cfg.model_dump(mode="json"))  # as the log stores it, read back
    assert stored.sim == cfg.sim
    with pytest.raises(ConfigError, match="sim.answer_noise"):
        build_config(overrides={"sim.answer_noise": 2})
    with pytest.raises(ConfigError, match="question answering"):
        build_config(overrides={"sim.noise": "moderate", "env": "sql"})


def test_a_noisy_mode_outside_question_answering_is_refused_before_a_run_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["run", "--env", "sql", "--set", "sim.noise=moderate", "-q"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "noisy mode" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "skillstate.db").exists() or "no runs" in CliRunner().invoke(cli, ["runs"]).output


def _events(store, run_id):
    return [(e.type, e.payload) for e in lineage_events(store, run_id) if e.type != "RunStarted"]


def test_a_noisy_run_is_reproducible_replays_and_verifies_and_never_shares_calls_with_a_clean_one(tmp_path):
    noisy = small_config(num_epochs=1, sim={"noise": "moderate"})
    first = Trainer(noisy, db=f"sqlite:///{tmp_path / 'a.db'}", run_id="n").train()
    report = verify(first.store, "n")
    assert report.ok and report.checked == report.total
    # a clean run first, in the same database: the noisy run is served nothing of it
    shared = f"sqlite:///{tmp_path / 'b.db'}"
    clean = Trainer(small_config(num_epochs=1), db=shared, run_id="c").train()
    again = Trainer(noisy, db=shared, run_id="n").train()
    assert _events(again.store, "n") == _events(first.store, "n")
    assert first.summary["baseline_score"] != clean.summary["baseline_score"]
    events = _events(first.store, "n")
    proposed = [e["content"] for t, p in events if t == "PatchProposed" for e in json.loads(p).get("edits", [])]
    world = SimWorld(ITEMS, SimNoise(harmful_edits=0.25))
    assert any(trap.text in c for c in proposed for trap in world.cross_harms)


@pytest.mark.slow
def test_the_benchmarks_seed_sweep_reports_both_programs_in_both_worlds(tmp_path):
    pytest.importorskip("skillrl", reason="the bench extra (skillrl==1.0.0) is not installed")
    bench = Path(__file__).resolve().parent.parent / "bench" / "vs_skillrl.py"
    out = tmp_path / "runs.json"
    proc = subprocess.run([sys.executable, str(bench), "--smoke", "--seeds", "1,2", "--epochs", "1", "--json",
                           str(out), "--work-dir", str(tmp_path / "work")], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    table = [row[:3] for row in rows if len(row) > 3 and row[0] in ("noisy", "clean") and row[2] == "2"]
    assert table == [[w, p, "2"] for w in ("noisy", "clean") for p in ("skillstate", "skillrl")]
    assert any(line.startswith("noisy: mean test lead over skillrl") for line in proc.stdout.splitlines())
    runs = json.loads(out.read_text())
    assert sorted({(r["world"], r["seed"], r["program"]) for r in runs}) == sorted(
        (w, s, p) for w in ("noisy", "clean") for s in (1, 2) for p in ("skillstate", "skillrl"))
    assert all(r["best_skill"] and r["anatomy"]["chars"] == len(r["best_skill"]) for r in runs)
