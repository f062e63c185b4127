"""Validation against the Agent Skills specification: the spec's valid names pass, each invalid kind
is refused with its own one-line message, warnings are data, and the front matter round-trips."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from skillstate.errors import UserError
from skillstate.skilltree import (
    SkillFile,
    SkillTree,
    add_front_matter,
    from_markdown,
    name_problem,
    parse_front_matter,
    set_field,
    validate_skill,
)
from skillstate.skilltree.validate import _NAME


def skill_md(name: object = "pdf-processing", description: object = "Extract text from PDFs. Use for PDFs.",
             body: str = "# Steps\n", **extra: object) -> str:
    fields = {"name": name, "description": description, **extra}
    dumped = yaml.safe_dump({k: v for k, v in fields.items() if v is not None}, sort_keys=False)
    return "---\n" + dumped + "---\n" + body


def tree_of(text: str, **others: str) -> SkillTree:
    return SkillTree({"SKILL.md": SkillFile.of_text(text), **{p: SkillFile.of_text(t) for p, t in others.items()}})


def errors(text: str, dir_name: str | None = None, **others: str) -> list[str]:
    return [str(e) for e in validate_skill(tree_of(text, **others), dir_name).errors]


def warnings(text: str, **others: str) -> list[str]:
    report = validate_skill(tree_of(text, **others))
    assert report.ok, report.errors
    return [str(w) for w in report.warnings]


@pytest.mark.parametrize("name", ["pdf-processing", "data-analysis", "code-review", "a", "x1", "a" * 64, "v2-api-3"])
def test_the_specs_valid_names_pass(name):
    assert name_problem(name) is None
    report = validate_skill(tree_of(skill_md(name)), name)
    assert report.ok and report.name == name and not report.warnings


ONLY = "use lowercase letters, digits and hyphens only"


@pytest.mark.parametrize("name, message", [
    ("PDF-Processing", "name 'PDF-Processing' has uppercase letters: use lowercase letters, digits and hyphens only"),
    ("-pdf", "name '-pdf' starts or ends with a hyphen"),
    ("pdf-", "name 'pdf-' starts or ends with a hyphen"),
    ("pdf--processing", "name 'pdf--processing' has a double hyphen"),
    ("pdf_processing", "name 'pdf_processing' has the character '_': " + ONLY),
    ("café", "name 'café' has the character 'é': " + ONLY),
    ("a b", "name 'a b' has the character ' ': " + ONLY),
    ("", "name is empty"),
    ("a" * 65, "name is 65 characters long; at most 64 are allowed"),
    (12, "name must be text, not int 12"),
])
def test_each_invalid_name_is_refused_with_its_message(name, message):
    assert errors(skill_md(name)) == [f"SKILL.md: {message}"]


@given(st.text(alphabet="abz09-_A ", max_size=70))
def test_name_problem_agrees_with_the_rule(name):
    ok = 1 <= len(name) <= 64 and _NAME.fullmatch(name) is not None
    assert (name_problem(name) is None) == ok


def test_the_name_must_equal_the_directory_name():
    assert errors(skill_md("pdf-processing"), "pdf") == [
        "SKILL.md: name 'pdf-processing' differs from its directory's name 'pdf': they must be equal"]
    assert errors(skill_md("pdf-processing"), None) == []  # no directory (a lone file): nothing to compare


def test_description_and_compatibility_lengths():
    assert errors(skill_md(description="d" * 1024)) == []
    assert errors(skill_md(description="d" * 1025)) == [
        "SKILL.md: description is 1,025 characters long; at most 1,024 are allowed"]
    assert errors(skill_md(description="  ")) == ["SKILL.md: description is empty"]
    assert errors(skill_md(description=True)) == ["SKILL.md: description must be text, not bool"]
    assert errors(skill_md(compatibility="c" * 500)) == []
    assert errors(skill_md(compatibility="c" * 501)) == [
        "SKILL.md: compatibility is 501 characters long; at most 500 are allowed"]


def test_missing_pieces():
    assert errors(skill_md(name=None)) == [
        "SKILL.md: the front matter has no name (1-64 lowercase letters, digits and hyphens)"]
    assert errors(skill_md(description=None)) == [
        "SKILL.md: the front matter has no description (what the skill does and when to use it)"]
    report = validate_skill(SkillTree({"README.md": SkillFile(b"x")}), "s")
    assert [str(e) for e in report.errors] == [
        "SKILL.md is missing (an Agent Skill holds SKILL.md at the top of its directory)"]
    assert errors("# Just markdown\n")[0].startswith("SKILL.md: has no front matter: it must start with a '---' line")
    assert errors("---\nname: x\n") == [
        "SKILL.md: the front matter opened by the first line '---' is never closed by another '---' line"]
    assert errors("---\nname: [x\n---\n")[0].startswith("SKILL.md: the front matter is not valid YAML:")
    assert errors("---\n- a\n- b\n---\n") == [
        "SKILL.md: the front matter must be a YAML mapping (key: value lines), not a list"]
    assert errors("---\nname: a\nname: b\ndescription: d\n---\n")[0].startswith(
        "SKILL.md: the front matter is not valid YAML: the key 'name' appears twice (line 3)")
    assert errors(skill_md(metadata=["a"])) == ["SKILL.md: metadata must be a mapping of keys to values, not list"]
    two = errors(skill_md(name="Bad", description=""))
    assert len(two) == 2
    report = validate_skill(tree_of(skill_md(name="Bad", description="")))
    assert report.first_error().endswith("(and 1 more problem)")
    with pytest.raises(UserError, match="has uppercase letters"):
        report.raise_if_invalid()


def test_a_plain_markdown_skill_is_valid_only_when_allowed():
    tree = from_markdown("# Question answering\n\nOne word.\n")
    assert not validate_skill(tree).ok
    report = validate_skill(tree, allow_plain=True)
    assert report.ok and not report.agent_skill and report.body_lines == 3
    assert "plain markdown skill" in str(report.warnings[0])


def test_warnings_are_data():
    assert warnings(skill_md(body="line\n" * 500)) == []
    assert warnings(skill_md(body="line\n" * 501)) == [
        "SKILL.md: the body has 501 lines; keep it under 500 and move detail into references/"]
    body = ("Read [the guide](references/guide.md), [missing](references/nope.md#part), [web](https://x.org),\n"
            "[top](#steps), run `python scripts/run.py` or scripts/gone.sh, and see [up](../other/SKILL.md).\n"
            "```\n[in code](references/fenced.md)\n```\n")
    found = warnings(skill_md(body=body), **{"references/guide.md": "g", "scripts/run.py": "r"})
    assert found == ["SKILL.md: links to references/nope.md, which the skill does not hold",
                     "SKILL.md: links to scripts/gone.sh, which the skill does not hold",
                     "SKILL.md: links to ../other/SKILL.md, outside the skill directory",
                     "SKILL.md: links to references/fenced.md, which the skill does not hold"]
    assert warnings(skill_md(body="See references/ for more, and [dir](references)."), **{"references/a.md": "a"}) == []
    extra = warnings(skill_md(**{"metadata": {"version": 1.0}, "allowed-tools": ["Read"], "user-invocable": True}))
    assert extra == ["SKILL.md: metadata 'version' is not a string (the specification maps strings to strings; "
                     "quote it)",
                     "SKILL.md: allowed-tools is not one string (the specification lists tools separated by spaces)",
                     "SKILL.md: front-matter key 'user-invocable' not in the specification (kept as is; agents may "
                     "ignore them)"]
    lower = validate_skill(SkillTree({"skill.md": SkillFile.of_text(skill_md())}))
    assert lower.ok and str(lower.warnings[0]).startswith("skill.md: name it SKILL.md")


FRONT = ("---\r\n# kept comment\r\nname: pdf-processing\r\ndescription: >-\r\n  Folded\r\n  text.\r\n"
         "license: Apache-2.0\r\nmetadata:\r\n  author: me\r\n  version: \"1.0\"\r\nx-custom: [1, 2]\r\n---\r\n"
         "# Body\r\n")


def test_set_field_changes_one_key_and_nothing_else():
    new = set_field(FRONT, "description", "New: text with a colon")
    assert new == FRONT.replace("description: >-\r\n  Folded\r\n  text.\r\n",
                                "description: 'New: text with a colon'\r\n")
    parsed = parse_front_matter(new)
    assert parsed is not None and list(parsed.fields) == ["name", "description", "license", "metadata", "x-custom"]
    assert parsed.fields["x-custom"] == [1, 2] and parsed.body == "# Body\r\n"
    added = set_field(FRONT, "compatibility", "Needs git")
    assert added.endswith("x-custom: [1, 2]\r\ncompatibility: Needs git\r\n---\r\n# Body\r\n")
    meta = set_field(FRONT, "metadata", {"author": "you"})
    assert "metadata:\r\n  author: you\r\nx-custom" in meta
    with pytest.raises(UserError, match="no front matter"):
        set_field("# plain\n", "name", "x")


def test_add_front_matter_turns_a_markdown_skill_into_an_agent_skill():
    text = add_front_matter("# QA\n\nOne word.\n", {"name": "qa", "description": "Answer questions: briefly."})
    report = validate_skill(tree_of(text), "qa")
    assert report.ok and report.description == "Answer questions: briefly."
    assert text.endswith("---\n# QA\n\nOne word.\n")
    with pytest.raises(UserError, match="already has a front matter"):
        add_front_matter(text, {"name": "qa"})


@given(st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=300))
@example("\x85")  # NEL: YAML reads it as a line break unless escaped
@example("a\u2028b\r\nc")
def test_set_field_round_trips_any_description(description):
    new = set_field(FRONT, "description", description)
    parsed = parse_front_matter(new)
    before = parse_front_matter(FRONT)
    assert parsed is not None and before is not None
    assert dict(parsed.fields) == {**before.fields, "description": description}
    assert parsed.body == before.body and new.startswith("---\r\n# kept comment\r\nname: pdf-processing\r\n")


def test_set_field_splits_lines_at_newlines_only():
    text = "---\nname: x\ndescription: \"a\u2028b\"\nlicense: MIT\n---\nbody\u2028more\n"
    new = set_field(text, "license", "Apache-2.0")
    assert new == text.replace("MIT", "Apache-2.0")
    report = validate_skill(tree_of(new), "x")
    assert report.ok and report.body_lines == 1 and report.description == "a\u2028b"
