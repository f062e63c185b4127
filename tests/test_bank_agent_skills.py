"""A skill bank exported as Agent Skills directories (issue 23): every bank
skill becomes a valid skill with a unique name, whatever its title."""

from __future__ import annotations

from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import call

from skillstate.bank.agent_skills import MISTAKES, bank_skill_trees, slug
from skillstate.bank.skills import Bank, BankSkill, SkillProvenance
from skillstate.skilltree import SKILL_MD, load_skill, parse_front_matter, validate_skill
from skillstate.skilltree.validate import name_problem

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=120)
skill = st.builds(lambda title, principle, when, category: BankSkill.make(
    title, principle, when_to_apply=when, category=category, provenance=SkillProvenance(origin="distill")),
    text, text, text, st.one_of(st.none(), st.sampled_from(["arithmetic", "reading"])))


@examples(full=200, sampled=40)
def test_every_bank_skill_becomes_a_valid_agent_skill_with_a_name_of_its_own(max_examples):
    @given(st.lists(skill, max_size=8), st.lists(text, max_size=3))
    @settings(max_examples=max_examples, deadline=None)
    def check(skills, mistakes):
        unique = list({s.id: s for s in skills}.values())
        kept = {" ".join(m.split()).casefold(): m for m in mistakes if m.strip()}  # a bank holds each mistake once
        bank = Bank(skills=tuple(unique), mistakes=tuple(kept.values()))
        out = bank_skill_trees(bank)
        names = [name for name, _ in out]
        assert len(set(names)) == len(names) == len(bank.skills) + (1 if bank.mistakes else 0)
        for name, tree in out:
            assert name_problem(name) is None
            report = validate_skill(tree, name)
            assert report.ok, report.errors
            front = parse_front_matter(tree[SKILL_MD].text)
            assert front is not None and front.fields["name"] == name and front.fields["description"].strip()

    check()


def test_names_are_readable_and_bounded():
    assert slug("Unit conversion: check the magnitude!", "x") == "unit-conversion-check-the-magnitude"
    assert slug("Ünïcödé   title", "x") == "unicode-title"
    assert slug("???", "fallback") == "fallback"
    long = slug("word " * 40, "x")
    assert len(long) <= 64 and not long.endswith("-")


def test_a_bank_run_exports_one_directory_per_skill(tmp_path):
    db = f"sqlite:///{tmp_path / 'b.db'}"
    call("run", "--mode", "bank", "--epochs", "1", "-q", "--run-id", "bk", "--db", db)
    out = call("export", "bk", "--into", str(tmp_path / "skills"), "--db", db)
    written = sorted(p.name for p in (tmp_path / "skills").iterdir())
    assert len(written) == out.count("wrote ") >= 2 and MISTAKES in written
    for name in written:
        loaded = load_skill(tmp_path / "skills" / name)
        assert validate_skill(loaded.tree, loaded.dir_name).ok
    refused = call("export", "bk", "--into", str(tmp_path / "skills"), "--db", db, code=2)
    assert "exists" in refused
    assert "--into DIR" in call("export", "bk", "-o", str(tmp_path / "b.skill"), "--db", db, code=2)
