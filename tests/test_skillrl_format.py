"""SkillRL's own bank JSON: read into a skillstate Bank, written back, and
detected where a bank file is read."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.bank.skillrl_format import (
    bank_from_text,
    from_skillrl,
    is_bank_text,
    mode_for_skill_file,
    to_skillrl,
)
from skillstate.bank.skills import Bank, BankSkill, Mistake, SkillProvenance
from skillstate.errors import ConfigError

SKILLRL = {
    "general_skills": [{"skill_id": "gen_001", "title": "Systematic Exploration",
                        "principle": "Search every place once before revisiting.", "when_to_apply": "Always."}],
    "task_specific_skills": {
        "heat": [{"skill_id": "hea_001", "title": "Microwave first", "principle": "Heat with the microwave.",
                  "when_to_apply": "A heat task."}],
        "clean": [{"skill_id": "cle_001", "title": "Sink", "principle": "Clean in the sink.", "when_to_apply": ""}],
    },
    "common_mistakes": [{"mistake_id": "err_001", "description": "Revisiting searched places.",
                         "why_it_happens": "No memory.", "how_to_avoid": "Keep a list of visited places."}],
    "metadata": {"source": "test"},
}


def test_reading_skillrls_bank_keeps_ids_tiers_categories_and_mistakes():
    bank = from_skillrl(SKILLRL)
    assert [s.id for s in bank.skills] == ["gen_001", "hea_001", "cle_001"]
    assert bank.by_id("gen_001").tier == "general" and bank.by_id("hea_001").category == "heat"
    assert all(s.provenance.origin == "import" for s in bank.skills)
    assert [m.text for m in bank.mistakes] == [
        "Revisiting searched places. How to avoid: Keep a list of visited places."]
    assert bank_from_text(json.dumps(SKILLRL)) == bank


def test_writing_gives_skillrls_layout_back():
    out = to_skillrl(from_skillrl(SKILLRL))
    assert out["general_skills"] == SKILLRL["general_skills"]
    assert out["task_specific_skills"] == SKILLRL["task_specific_skills"]
    (mistake,) = out["common_mistakes"]
    assert mistake["description"] == "Revisiting searched places."
    assert mistake["how_to_avoid"] == "Keep a list of visited places."


def test_the_search_banks_query_type_skills_are_its_task_skills():
    data = {**SKILLRL, "query_type_skills": SKILLRL["task_specific_skills"]}
    del data["task_specific_skills"]
    assert from_skillrl(data).categories() == ["clean", "heat"]


words = st.text(alphabet="abcdef ", min_size=1, max_size=12).filter(str.strip)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(words, words, st.sampled_from([None, "heat", "cool"])), max_size=6),
       st.lists(st.tuples(words, st.sampled_from([None, "heat"])), max_size=4))
def test_a_bank_survives_the_round_trip(rows, mistakes):
    skills = {}
    for title, principle, category in rows:
        s = BankSkill.make(title, principle, category=category, provenance=SkillProvenance(origin="import"))
        skills.setdefault(s.id, s)
    bank = Bank(skills=tuple(skills.values())).with_mistakes(Mistake(text=t, category=c) for t, c in mistakes)
    back = from_skillrl(json.loads(json.dumps(to_skillrl(bank))))
    assert {s.id: (s.title, s.principle, s.category) for s in back.skills} == {
        s.id: (s.title, s.principle, s.category) for s in bank.skills}
    assert back.mistakes == bank.mistakes


def test_detection_and_the_mode_a_skill_file_is_scored_in():
    own = Bank().model_dump_json()
    assert is_bank_text(own) and is_bank_text(json.dumps(SKILLRL))
    assert not is_bank_text("# A skill\n- be brief") and not is_bank_text('{"other": 1}')
    assert mode_for_skill_file(own, "b.json", None) == "bank"
    assert mode_for_skill_file("# skill", "s.md", None) == "skill"
    with pytest.raises(ConfigError, match="is a skill bank"):
        mode_for_skill_file(own, "b.json", "skill")
    with pytest.raises(ConfigError, match="not a skill bank"):
        mode_for_skill_file("# skill", "s.md", "bank")


def test_a_malformed_skillrl_bank_is_one_line():
    with pytest.raises(ConfigError) as info:
        from_skillrl({**SKILLRL, "general_skills": [{"principle": "no title"}]})
    assert "\n" not in str(info.value) and "general_skills[0]" in str(info.value)
