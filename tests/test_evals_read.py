"""Reading a skill's own evals (skillstate.evals.read) and splitting them (skillstate.evals.split)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.errors import DataError, UserError
from skillstate.evals import (
    DEFAULT_SIZES,
    EVALS_FILE,
    find_trigger_file,
    has_evals,
    read_eval_data_dir,
    read_evals_file,
    read_skill_evals,
    read_trigger_evals,
    split_evals,
    split_sizes,
)

SETTINGS = settings(max_examples=150, deadline=None)


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def skill(tmp_path: Path, evals: Any, files: dict[str, str] | None = None) -> Path:
    """A skill directory holding SKILL.md, evals/evals.json and `files` (path -> text)."""
    root = tmp_path / "my-skill"
    write(root / "SKILL.md", "---\nname: my-skill\ndescription: d\n---\n# My skill\n")
    write(root / EVALS_FILE, evals)
    for name, text in (files or {}).items():
        write(root / name, text)
    return root


def item(**fields: Any) -> dict[str, Any]:
    return {"id": 1, "prompt": "Summarize the report", **fields}


def refused(root: Path, *parts: str) -> str:
    """The one line reading `root`'s evals is refused with; it names each of `parts`."""
    with pytest.raises(DataError) as caught:
        read_skill_evals(root)
    message = str(caught.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


# --- a skill-creator evals.json -----------------------------------------------------------------------


def test_reads_skill_creator_evals(tmp_path):
    root = skill(tmp_path, {
        "skill_name": "my-skill",
        "evals": [
            {"id": 1, "prompt": "Extract the names", "expected_output": "A list of names",
             "files": ["evals/files/sample1.txt", "./evals/files/sample2.txt"],
             "expectations": ["The output includes the name 'John Smith'"]},
            {"id": 2, "prompt": "Fill the form", "expected_output": "",
             "assertions": ["The skill used script Y", {"type": "contains", "value": "Done"},
                            {"type": "not-icontains", "value": "sorry", "weight": 2, "metric": "no apology"}]},
            {"id": "three", "prompt": "Only a prompt"},
        ],
    }, {"evals/files/sample1.txt": "John Smith\n", "evals/files/sample2.txt": "Sarah\n"})
    assert has_evals(root)
    evals = read_skill_evals(root)
    assert evals.skill_name == "my-skill"
    assert evals.path == root / EVALS_FILE
    assert [i.id for i in evals.items] == ["1", "2", "three"]  # ids are strings
    first, second, third = evals.items
    assert [f.name for f in first.files] == ["evals/files/sample1.txt", "evals/files/sample2.txt"]
    assert first.files[0].path == (root / "evals/files/sample1.txt").resolve()
    assert first.expected_output == "A list of names"
    assert first.expectations == ("The output includes the name 'John Smith'",)
    # A plain-text assertion (as skill-creator writes them) is a statement for the judge.
    assert second.expectations == ("The skill used script Y",)
    assert [a.name for a in second.assertions] == ["contains", "not-icontains"]
    assert second.assertions[1].negate and second.assertions[1].type == "icontains"
    assert second.assertions[1].weight == 2 and second.assertions[1].metric == "no apology"
    assert third.files == () and third.expectations == () and third.assertions == ()
    assert evals.triggers == () and evals.trigger_path is None
    assert read_skill_evals(root / "SKILL.md") == evals  # SKILL.md stands for its directory


def test_a_bare_list_and_promptfoo_assert_key(tmp_path):
    root = skill(tmp_path, [{**item(), "assert": [{"type": "equals", "value": "4"}]}])
    (only,) = read_skill_evals(root).items
    assert only.assertions[0].type == "equals"


def test_a_bom_is_fine(tmp_path):
    root = skill(tmp_path, "\ufeff" + json.dumps([item()]))
    assert read_skill_evals(root).items[0].prompt == "Summarize the report"


def test_read_evals_file_with_its_own_base(tmp_path):
    write(tmp_path / "data" / "input.csv", "a,b\n")
    path = write(tmp_path / "elsewhere.json", {"evals": [item(files=["input.csv"])]})
    name, items = read_evals_file(path, tmp_path / "data")
    assert name is None and items[0].files[0].name == "input.csv"


# --- malformed files: one line naming the file, the item and the problem --------------------------------

BAD_ITEMS = [
    (item(prompt=None) | {"prompt": None}, ["item 1 (id 1)", "missing prompt"]),
    ({"id": 1}, ["item 1 (id 1)", "missing prompt"]),
    (item(prompt=["a"]), ["item 1 (id 1)", "prompt must be a string, not a list"]),
    (item(prompt="  "), ["prompt is empty"]),
    ({"prompt": "p"}, ["item 1", "missing id"]),
    (item(id=True), ["id must be a number or a string"]),
    (item(id=" "), ["id is empty"]),
    (item(expected_output=3), ["expected_output must be a string, not a number"]),
    (item(expectations="The output includes X"), ["expectations must be a list, not a string"]),
    (item(expectations=["ok", 5]), ["expectations[1] must be a non-empty string"]),
    (item(assertions={"type": "contains"}), ["assertions must be a list, not an object"]),
    (item(assertions=[""]), ["assertions[0] is an empty string"]),
    (item(assertions=[{"type": "contain", "value": "x"}]),
     ["item 1 (id 1)", "assertions[0]", "unknown assertion type 'contain'", "did you mean 'contains'"]),
    (item(assertions=[{"type": "sparkles", "value": "x"}]), ["unknown assertion type 'sparkles'", "known:"]),
    (item(assertions=[{"value": "x"}]), ["assertions[0]: missing type"]),
    (item(assertions=[{"type": "contains", "value": "x", "transform": "output.upper()"}]),
     ["unknown key 'transform'"]),
    (item(assertions=[{"type": "regex", "value": "(unclosed"}]), ["regex '(unclosed' does not compile"]),
    (item(assertions=[{"type": "regex", "value": ""}]), ["regex needs a non-empty value"]),
    (item(assertions=[{"type": "contains", "value": 3}]), ["contains needs a value that is a string"]),
    (item(assertions=[{"type": "contains-any", "value": []}]), ["non-empty list of strings"]),
    (item(assertions=[{"type": "contains-all", "value": ["a", 1]}]), ["contains-all value[1]"]),
    (item(assertions=[{"type": "equals"}]), ["equals needs a value"]),
    (item(assertions=[{"type": "python", "value": "checks"}]), ["not of the form module:function"]),
    (item(assertions=[{"type": "python", "value": "my checks:fn"}]), ["not of the form module:function"]),
    (item(assertions=[{"type": "python", "value": "mod:not-a-name"}]), ["not of the form module:function"]),
    (item(assertions=[{"type": "python", "value": "evals/missing.py:fn"}]),
     ["the python file 'evals/missing.py' does not exist"]),
    (item(assertions=[{"type": "python", "value": "../outside.py:fn"}]), ["'..' segment"]),
    (item(assertions=[{"type": "json-schema"}]), ["json-schema needs a value"]),
    (item(assertions=[{"type": "json-schema", "value": {"type": "banana"}}]), ["not a valid JSON Schema"]),
    (item(assertions=[{"type": "json-schema", "value": "file://evals/none.json"}]),
     ["the schema file 'evals/none.json' does not exist"]),
    (item(assertions=[{"type": "contains", "value": "x", "threshold": 0.5}]), ["threshold has no meaning"]),
    (item(assertions=[{"type": "python", "value": "m:f", "threshold": 2}]), ["threshold must be between 0 and 1"]),
    (item(assertions=[{"type": "contains", "value": "x", "weight": -1}]), ["weight must be 0 or more"]),
    (item(assertions=[{"type": "contains", "value": "x", "weight": "2"}]), ["weight must be a number"]),
    (item(assertions=[{"type": "command", "value": ""}]), ["command needs a value"]),
    (item(assertions=[{"type": "command", "value": ["pytest", 3]}]), ["command needs a value"]),
    (item(assertions=[{"type": "llm-rubric"}]), ["llm-rubric needs a value that is a string, not null"]),
    (item(files="a.txt"), ["files must be a list, not a string"]),
    (item(files=[7]), ["files[0] must be a path"]),
    (item(files=["evals/files/nope.pdf"]), ["files[0] 'evals/files/nope.pdf' does not exist in"]),
    (item(files=["../secret.txt"]), ["files[0] '../secret.txt' is refused", "'..' segment"]),
    (item(files=["/etc/passwd"]), ["files[0] '/etc/passwd' is refused", "absolute"]),
    (item(files=["evals"]), ["files[0] 'evals' is not a regular file; list the files in it"]),
    (item(should_trigger=True), ["has should_trigger", "evals/trigger_evals.json"]),
    (item(assertions=[], **{"assert": []}), ["both assert and assertions"]),
    ("not an item", ["item 1 is a string, not an object"]),
]


@pytest.mark.parametrize(("bad", "parts"), BAD_ITEMS, ids=[str(i) for i in range(len(BAD_ITEMS))])
def test_a_malformed_item_is_one_line(tmp_path, bad, parts):
    root = skill(tmp_path, {"skill_name": "my-skill", "evals": [bad]})
    refused(root, str(root / EVALS_FILE), *parts)


def test_the_second_item_is_named(tmp_path):
    root = skill(tmp_path, {"evals": [item(), item(id=7, assertions=[{"type": "regex", "value": "["}])]})
    refused(root, "item 2 (id 7): assertions[0]: regex '[' does not compile")


@pytest.mark.parametrize(("text", "parts"), [
    ("{not json", ["not valid JSON (line 1"]),
    ("", ["not valid JSON"]),
    ('"a string"', ["a list of items or an object with an \"evals\" list, not a string"]),
    ('{"skill_name": "x"}', ["an object with an \"evals\" list"]),
    ('{"evals": {"id": 1}}', ["\"evals\" must be a list of items, not an object"]),
    ('{"evals": []}', ["no evals"]),
    ('{"skill_name": 3, "evals": []}', ["skill_name must be a string"]),
    ("[" * 100_000 + "]" * 100_000, ["nested too deeply"]),
])
def test_a_malformed_file_is_one_line(tmp_path, text, parts):
    refused(skill(tmp_path, text), *parts)


def test_duplicate_ids(tmp_path):
    root = skill(tmp_path, [item(id=1), item(id=2), item(id="1")])
    refused(root, "item 3: duplicate id '1' (also item 1 of evals.json)")


def test_a_file_that_leaves_through_a_symlink(tmp_path):
    (tmp_path / "secret.txt").write_text("s")
    root = skill(tmp_path, [item(files=["evals/link.txt"])])
    (root / "evals" / "link.txt").symlink_to(tmp_path / "secret.txt")
    refused(root, "files[0] 'evals/link.txt' leads outside")


def test_no_evals_file_and_no_directory(tmp_path):
    (tmp_path / "bare").mkdir()
    assert not has_evals(tmp_path / "bare")
    with pytest.raises(DataError, match=r"no evals/evals.json"):
        read_skill_evals(tmp_path / "bare")
    with pytest.raises(DataError, match="does not exist"):
        read_skill_evals(tmp_path / "nowhere")


def test_an_unreadable_evals_file(tmp_path):
    root = skill(tmp_path, [item()])
    (root / EVALS_FILE).unlink()
    (root / EVALS_FILE).mkdir()
    refused(root, "cannot read")


def test_a_data_error_is_a_user_error():
    assert issubclass(DataError, UserError)  # the CLI prints it in one line and exits 2


# --- trigger evals --------------------------------------------------------------------------------------


def test_trigger_evals_in_both_shapes(tmp_path):
    root = skill(tmp_path, [item()], {"evals/trigger_evals.json": json.dumps(
        [{"query": "make my pdf smaller", "should_trigger": True}, {"query": "weather?", "should_trigger": False}])})
    evals = read_skill_evals(root)
    assert evals.trigger_path == root / "evals/trigger_evals.json"
    assert [(t.query, t.should_trigger) for t in evals.triggers] == [("make my pdf smaller", True),
                                                                     ("weather?", False)]
    other = write(tmp_path / "set.json", {"evals": [{"prompt": "improve SKILL.md", "should_trigger": True}]})
    assert read_trigger_evals(other)[0].query == "improve SKILL.md"


def test_the_review_page_name_is_found(tmp_path):
    root = skill(tmp_path, [item()], {"evals/eval_set.json": json.dumps([{"query": "q", "should_trigger": True}])})
    assert find_trigger_file(root) == root / "evals/eval_set.json"
    assert len(read_skill_evals(root).triggers) == 1


def test_two_trigger_files_are_refused(tmp_path):
    one = json.dumps([{"query": "q", "should_trigger": True}])
    root = skill(tmp_path, [item()], {"evals/trigger_evals.json": one, "evals/eval_set.json": one})
    refused(root, "both evals/trigger_evals.json and evals/eval_set.json", "keep one")


@pytest.mark.parametrize(("data", "parts"), [
    ([{"query": "q"}], ["item 1: missing should_trigger"]),
    ([{"query": "q", "should_trigger": "yes"}], ["should_trigger must be true or false, not a string"]),
    ([{"should_trigger": True}], ["item 1: missing query"]),
    ([{"query": "", "should_trigger": True}], ["query is empty"]),
    ([{"query": "q", "prompt": "q", "should_trigger": True}], ["both query and prompt"]),
    ([{"query": "q", "should_trigger": True}, {"query": "q", "should_trigger": False}],
     ["item 2: the same query as item 1"]),
    ([], ["no trigger evals"]),
    (["q"], ["item 1 is a string, not an object"]),
    ({"queries": []}, ["an object with an \"evals\" list"]),
])
def test_malformed_trigger_evals(tmp_path, data, parts):
    root = skill(tmp_path, [item()], {"evals/trigger_evals.json": json.dumps(data)})
    refused(root, "trigger_evals.json", *parts)


# --- a data directory -----------------------------------------------------------------------------------


def test_a_data_directory(tmp_path):
    data = tmp_path / "data"
    write(data / "inputs" / "a.txt", "x")
    write(data / "train.jsonl", "\n".join(json.dumps(item(id=n, files=["inputs/a.txt"])) for n in (1, 2)) + "\n\n")
    write(data / "val.json", [item(id=3, assertions=[{"type": "is-json"}])])
    write(data / "test.json", {"evals": [item(id=4, expectations=["It is short"])]})
    splits = read_eval_data_dir(data)
    assert {k: [i.id for i in v] for k, v in splits.items()} == {"train": ["1", "2"], "val": ["3"], "test": ["4"]}
    assert splits["train"][0].files[0].path == (data / "inputs" / "a.txt").resolve()


@pytest.mark.parametrize(("files", "parts"), [
    ({"train.jsonl": "{}\n"}, ["train.jsonl: line 1", "missing id"]),
    ({"train.jsonl": json.dumps(item()) + "\n{oops\n"}, ["train.jsonl: line 2 is not valid JSON"]),
    ({"train.jsonl": json.dumps(item()), "val.jsonl": json.dumps(item())},
     ["val.jsonl: line 1: duplicate id '1' (also line 1 of train.jsonl)"]),
    ({"train.jsonl": json.dumps(item()), "train.json": "[]"}, ["both train.jsonl and train.json"]),
    ({"train.jsonl": json.dumps(item())}, ["missing val.jsonl"]),
    ({"train.jsonl": "\n"}, ["train.jsonl: no evals"]),
])
def test_a_malformed_data_directory(tmp_path, files, parts):
    for name, text in files.items():
        write(tmp_path / name, text)
    with pytest.raises(DataError) as caught:
        read_eval_data_dir(tmp_path)
    assert "\n" not in str(caught.value)
    for part in parts:
        assert part in str(caught.value)


def test_a_data_path_that_is_no_directory(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_eval_data_dir(tmp_path / "none")
    with pytest.raises(DataError, match="is a file"):
        read_eval_data_dir(write(tmp_path / "f.json", "[]"))


# --- splitting ------------------------------------------------------------------------------------------

ids = st.lists(st.text(min_size=1, max_size=6), min_size=3, max_size=40, unique=True)
shares = st.tuples(*(st.integers(1, 20),) * 3).map(lambda t: tuple(x / sum(t) for x in t))


@SETTINGS
@given(ids, st.integers(), shares)
def test_a_split_is_a_deterministic_partition(names, seed, sizes):
    splits = split_evals(names, seed, sizes)
    parts = [splits.train, splits.val, splits.test]
    assert sorted(x for p in parts for x in p) == sorted(names)  # every item once
    assert all(parts)  # none empty
    assert split_evals(names, seed, sizes) == splits  # the same seed, the same split
    for part in parts:  # the file's order kept
        assert part == [x for x in names if x in part]
    # the place of an item depends on its id, not on its position
    again = split_evals(list(reversed(names)), seed, sizes)
    assert [sorted(p) for p in again.as_dict().values()] == [sorted(p) for p in parts]


@SETTINGS
@given(st.integers(3, 500), shares)
def test_shares_are_respected(n, sizes):
    counts = split_sizes(n, sizes)
    assert sum(counts) == n and min(counts) >= 1
    for count, share in zip(counts, sizes, strict=True):
        assert abs(count - share * n) < 3  # within rounding and the one-each floor


@SETTINGS
@given(ids, st.integers(), st.tuples(*(st.integers(1, 5),) * 3))
def test_counts_are_respected(names, seed, counts):
    if sum(counts) > len(names):
        with pytest.raises(DataError, match=f"needs at least {sum(counts)} evals"):
            split_evals(names, seed, counts)
        return
    splits = split_evals(names, seed, counts)
    assert (len(splits.train), len(splits.val), len(splits.test)) == counts
    assert len(set(splits.train + splits.val + splits.test)) == sum(counts)


def test_seeds_differ_and_the_default_is_sixty_twenty_twenty():
    names = [f"e{n}" for n in range(50)]
    assert split_sizes(50) == (30, 10, 10) and DEFAULT_SIZES == (0.6, 0.2, 0.2)
    assert split_evals(names, 1) != split_evals(names, 2)


def test_too_few_evals_is_one_line(tmp_path):
    with pytest.raises(DataError) as caught:
        split_evals(["a", "b"], 0, source="my-skill/evals/evals.json")
    assert str(caught.value) == ("my-skill/evals/evals.json: needs at least 3 evals for train, val and test; "
                                 "the file has 2")


@pytest.mark.parametrize("sizes", [(0.5, 0.5), (0.5, 0.5, 0.5), (0.8, 0.2, 0.0), (3, 0, 1), (1, 1, True),
                                   (float("nan"), 0.5, 0.5)])
def test_bad_sizes(sizes):
    with pytest.raises(UserError):
        split_sizes(10, sizes)


def test_split_of_eval_items(tmp_path):
    root = skill(tmp_path, [item(id=n) for n in range(10)])
    items = read_skill_evals(root).items
    splits = split_evals(items, 7)
    assert [len(p) for p in splits.as_dict().values()] == [6, 2, 2]
    assert split_evals(items, 7) == splits
