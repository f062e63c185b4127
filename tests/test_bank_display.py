"""How a skill-bank run is shown: the bank diff (skills added, dropped,
refined; mistakes changed), each bank step's label, the per-step bank
figures, and `skillstate diff` of a bank run as a table."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import small_config

from skillstate.bank.skills import Bank, BankSkill, SkillProvenance
from skillstate.cli.main import cli
from skillstate.engine.loading import load_run
from skillstate.log.events import GateDecided
from skillstate.log.events_bank import BankValidated
from skillstate.reading.bank_diff import bank_diff, is_empty, mistake_text
from skillstate.reading.bank_steps import step_labels, step_metrics
from skillstate.storage.store import Store
from skillstate.trainer import Trainer


def _skill(title: str, principle: str, category: str | None = "math", refines: str | None = None,
           origin: str = "distill") -> BankSkill:
    return BankSkill.make(title, principle, category=category,
                          provenance=SkillProvenance(origin=origin, step=1, refines=refines))


def test_a_bank_diff_names_added_dropped_and_refined_skills_and_mistakes():
    kept = _skill("check units", "Write the unit next to every number.")
    old = _skill("count letters", "Count the letters.", category="letters")
    gone = _skill("guess", "Guess when unsure.", category=None)
    new = _skill("count letters", "Spell the word out, then count the matches.", category="letters",
                 refines=old.id, origin="evolve")
    fresh = _skill("dates", "Name the weekday of both dates.", category="dates")
    before = Bank(skills=(kept, old, gone), mistakes=("Skipping units", "Answering too fast"))
    after = Bank(skills=(kept, new, fresh), mistakes=("Skipping units", "Forgetting the year"))
    d = bank_diff(before, after)
    assert [s["id"] for s in d["added"]] == [fresh.id]
    assert [s["id"] for s in d["dropped"]] == [gone.id]
    assert [(r["before"]["id"], r["after"]["id"]) for r in d["refined"]] == [(old.id, new.id)]
    diff = d["refined"][0]["diff"]
    assert "-principle: Count the letters." in diff
    assert "+principle: Spell the word out, then count the matches." in diff
    assert d["mistakes_added"] == ["Forgetting the year"] and d["mistakes_dropped"] == ["Answering too fast"]
    assert d["same"] == 1 and (d["size_before"], d["size_after"]) == (3, 3)
    assert is_empty(bank_diff(after, after)) and not is_empty(d)


def test_a_skill_kept_under_its_id_with_new_text_is_refined():
    a = _skill("t", "old text")
    b = a.model_copy(update={"when_to_apply": "always"})
    d = bank_diff(Bank(skills=(a,)), Bank(skills=(b,)))
    assert len(d["refined"]) == 1 and "+when: always" in d["refined"][0]["diff"] and d["same"] == 0


def test_a_mistake_reads_with_its_category_and_is_compared_within_it():
    from skillstate.bank.skills import Mistake

    assert mistake_text(Mistake(text="plain")) == "plain"
    assert mistake_text(Mistake(text="structured", category="math")) == "structured (math)"
    moved = bank_diff(Bank(mistakes=("Carry the one",)),
                      Bank(mistakes=(Mistake(text="Carry the one", category="math"),)))
    assert moved["mistakes_added"] == ["Carry the one (math)"] and moved["mistakes_dropped"] == ["Carry the one"]


@pytest.fixture(scope="module")
def bank_db(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('bankshow') / 'b.db'}"
    store = Store(url)
    Trainer(small_config(num_epochs=1, mode="bank"), store=store, run_id="bank").train()
    yield store, url
    store.close()


def test_each_bank_step_is_labelled_with_what_it_did(bank_db):
    store, _ = bank_db
    loaded = load_run(store, "bank")
    events = [s.event for s in loaded.lineage]
    labels = step_labels(events)
    assert set(labels) == {rec.step for rec in loaded.state.history}
    for step, label in labels.items():
        assert "skip" not in label and label.startswith("distilled"), label
        gated = [e for e in events if isinstance(e, GateDecided) and e.step == step and e.decision != "skip"]
        assert ("gated:" in label) == bool(gated), label
    assert any("val " in label and "evolved" in label for label in labels.values())
    for ev in events:  # a validation that rolled the distilled skills back says so, with both scores
        if isinstance(ev, BankValidated) and ev.kept is False:
            assert f"val {ev.scores.gate:.3f} < {ev.checked_score:.3f}: rolled back" in labels[ev.step]


def test_bank_step_metrics_hold_size_rates_and_retrieval_hits(bank_db):
    store, _ = bank_db
    loaded = load_run(store, "bank")
    sizes = {rec.step: 3 for rec in loaded.state.history}
    metrics = step_metrics([s.event for s in loaded.lineage], sizes)
    for row in metrics.values():
        assert row["bank.size"] == 3
        assert 0 <= row["bank.retrieval_hit_rate"] <= 1
    validated = [row for row in metrics.values() if "bank.validation.gate" in row]
    assert validated and all(any(k.startswith("bank.validation.by_task_type.") for k in row) for row in validated)


def test_diff_of_a_bank_run_is_a_table_not_a_json_line(bank_db):
    _, url = bank_db
    res = CliRunner().invoke(cli, ["diff", "bank", "0", "3", "--db", url], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("bank bank@step_0 -> bank@step_3: 0 -> ")
    assert any(line.startswith("added ") for line in lines)
    assert '{"mistakes"' not in res.output and all(len(line) <= 120 for line in lines)


def test_show_of_a_bank_step_says_what_it_did_not_its_budget(bank_db):
    from skillstate.cli.render import history_lines
    from skillstate.cli.steps import step_text
    from skillstate.reading.step_detail import step_detail

    store, _ = bank_db
    loaded = load_run(store, "bank")
    text = step_text(step_detail(store, loaded, 2), width=200)
    assert "budget" not in text.splitlines()[0] and "bank step: distilled" in text
    table = history_lines(loaded.state.history, 200, step_labels(e.event for e in loaded.lineage))
    assert "what the step did" in table[0] and "budget" not in table[0]
    assert not any(" skip " in line for line in table)
