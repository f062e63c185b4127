"""The deterministic graders of skillstate.evals.assertions, and an item's soft and hard score."""

from __future__ import annotations

import json
import math
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.evals import AssertionResult, EvalItem, grade, parse_assertion, scores
from skillstate.evals.assertions import python_result
from skillstate.evals.spec import AssertionSpecError

SETTINGS = settings(max_examples=150, deadline=None)


def make_item(*assertions: dict[str, Any], base: Path = Path("."), expectations: tuple[str, ...] = ()) -> EvalItem:
    return EvalItem(id="e1", prompt="p", expectations=expectations,
                    assertions=tuple(parse_assertion(a, base) for a in assertions))


def verdict(output: str, assertion: dict[str, Any], base: Path = Path(".")) -> AssertionResult:
    (result,) = grade(output, make_item(assertion, base=base)).results
    return result


# --- each type ------------------------------------------------------------------------------------------

CASES = [
    # (assertion, output, passed)
    ({"type": "equals", "value": "4"}, "4", True),
    ({"type": "equals", "value": "4"}, "  4\n", True),  # outer whitespace does not count
    ({"type": "equals", "value": "4"}, "4.0", False),
    ({"type": "equals", "value": {"a": [1, 2]}}, '{"a": [1, 2.0]}', True),
    ({"type": "equals", "value": {"a": True}}, '{"a": 1}', False),  # true is not 1
    ({"type": "equals", "value": [1]}, "not json", False),
    ({"type": "contains", "value": "Paris"}, "It is Paris.", True),
    ({"type": "contains", "value": "Paris"}, "It is paris.", False),
    ({"type": "icontains", "value": "PARIS"}, "It is paris.", True),
    ({"type": "not-contains", "value": "sorry"}, "Here it is.", True),
    ({"type": "not-contains", "value": "sorry"}, "I'm sorry.", False),
    ({"type": "starts-with", "value": "Yes"}, "Yes, it is.", True),
    ({"type": "starts-with", "value": "Yes"}, "No. Yes.", False),
    ({"type": "contains-any", "value": ["cat", "dog"]}, "a dog", True),
    ({"type": "contains-any", "value": ["cat", "dog"]}, "a cow", False),
    ({"type": "contains-all", "value": ["cat", "dog"]}, "cat and dog", True),
    ({"type": "contains-all", "value": ["cat", "dog"]}, "cat only", False),
    ({"type": "icontains-all", "value": ["CAT", "Dog"]}, "cat and DOG", True),
    ({"type": "icontains-any", "value": ["CAT"]}, "a cow", False),
    ({"type": "regex", "value": r"^\d{3}-\d{4}$"}, "555-1234", True),
    ({"type": "regex", "value": r"\bTODO\b"}, "all done", False),
    ({"type": "not-regex", "value": r"\bTODO\b"}, "all done", True),
    ({"type": "is-json"}, '{"a": 1}', True),
    ({"type": "is-json"}, '```json\n{"a": 1}\n```', True),  # one fenced block that is the whole output
    ({"type": "is-json"}, 'Here: {"a": 1}', False),
    ({"type": "is-json"}, "NaN", False),
    ({"type": "is-json", "value": {"type": "array"}}, '{"a": 1}', False),
    ({"type": "json-schema", "value": {"type": "object", "required": ["name"],
                                       "properties": {"age": {"type": "integer"}}}}, '{"name": "x", "age": 3}', True),
    ({"type": "json-schema", "value": {"type": "object", "properties": {"age": {"type": "integer"}}}},
     '{"age": "three"}', False),
    ({"type": "not-is-json"}, "plain words", True),
]


@pytest.mark.parametrize(("assertion", "output", "passed"), CASES, ids=[str(i) for i, _ in enumerate(CASES)])
def test_each_type(assertion, output, passed):
    result = verdict(output, assertion)
    assert result.passed is passed, result.reason
    assert result.score == float(passed)
    assert result.type == assertion["type"] and result.reason


def test_reasons_give_evidence():
    assert verdict("It is Paris.", {"type": "contains", "value": "Paris"}).reason == "found 'Paris' at character 6"
    assert "not found" in verdict("x", {"type": "contains", "value": "Paris"}).reason
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
    reason = verdict('{"age": "three"}', {"type": "json-schema", "value": schema}).reason
    assert "$.age" in reason and "integer" in reason
    assert "differs at character 2" in verdict("abXd", {"type": "equals", "value": "abcd"}).reason


def test_a_schema_from_a_file(tmp_path):
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "schema.json").write_text(json.dumps({"type": "array", "minItems": 2}))
    assertion = {"type": "json-schema", "value": "file://evals/schema.json"}
    assert verdict("[1, 2]", assertion, tmp_path).passed
    assert not verdict("[1]", assertion, tmp_path).passed


# --- negation, scores and weights -----------------------------------------------------------------------

NEGATABLE = st.sampled_from(["contains", "icontains", "starts-with", "regex", "equals"])
texts = st.text(alphabet="abAB .{}[]1\"", max_size=20)


@SETTINGS
@given(NEGATABLE, texts, texts)
def test_not_is_the_negation(kind, output, needle):
    value = needle or "a"
    if kind == "regex":
        value = "".join("\\" + c if not c.isalnum() and c != " " else c for c in value)  # a literal pattern
    plain = verdict(output, {"type": kind, "value": value})
    negated = verdict(output, {"type": "not-" + kind, "value": value})
    assert plain.passed is not negated.passed
    assert plain.score is not None and negated.score is not None
    assert plain.score + negated.score == 1.0
    assert negated.type == "not-" + kind


@SETTINGS
@given(texts, st.lists(st.text(alphabet="ab", min_size=1, max_size=2), min_size=1, max_size=4))
def test_any_all_and_their_negations(output, needles):
    found = [n in output for n in needles]
    assert verdict(output, {"type": "contains-any", "value": needles}).passed is any(found)
    assert verdict(output, {"type": "contains-all", "value": needles}).passed is all(found)
    assert verdict(output, {"type": "not-contains-any", "value": needles}).passed is not any(found)


@SETTINGS
@given(texts, st.lists(st.tuples(st.sampled_from(["a", "b", "x", "1"]), st.booleans(),
                                 st.sampled_from([0, 0.5, 1, 2, 3.25])), max_size=6))
def test_soft_is_the_weighted_share_and_hard_implies_one(output, specs):
    assertions = [{"type": "not-contains" if neg else "contains", "value": needle, "weight": w}
                  for needle, neg, w in specs]
    graded = grade(output, make_item(*assertions))
    counted = [r for r in graded.results if r.weight > 0]
    if not counted:
        assert graded.soft is None and graded.hard is None
        return
    total = sum(r.weight for r in counted)
    expected = sum(r.weight for r in counted if r.passed) / total
    assert graded.soft is not None and 0.0 <= graded.soft <= 1.0
    assert math.isclose(graded.soft, expected)
    assert graded.hard is all(r.passed for r in counted)
    if graded.hard:
        assert graded.soft == 1.0
    else:
        assert graded.soft < 1.0


def test_weights():
    item = make_item({"type": "contains", "value": "a", "weight": 3}, {"type": "contains", "value": "z"},
                     {"type": "contains", "value": "q", "weight": 0})
    graded = grade("a", item)
    assert graded.soft == 0.75 and graded.hard is False  # 3 of 4; the weight-0 miss is only reported
    assert [r.passed for r in graded.results] == [True, False, False]
    assert make_item({"type": "contains", "value": "a"}).assertions[0].weight == 1.0


def test_only_weight_zero_counts_nothing():
    graded = grade("a", make_item({"type": "contains", "value": "z", "weight": 0}))
    assert (graded.soft, graded.hard) == (None, None)
    assert scores([]) == (None, None)


# --- pending: a judge's, a workspace's ------------------------------------------------------------------


def test_judge_and_workspace_assertions_are_pending():
    item = make_item({"type": "contains", "value": "ok"}, {"type": "llm-rubric", "value": "Is polite", "weight": 2},
                     {"type": "command", "value": ["pytest", "-q"]}, expectations=("The output includes X",))
    graded = grade("ok", item)
    assert [r.status for r in graded.results] == ["passed", "needs_judge", "needs_workspace"]
    assert [r.reason for r in graded.pending] == ["needs a judge", "needs a workspace"]
    assert all(r.passed is None and r.score is None for r in graded.pending)
    assert graded.expectations == ("The output includes X",)
    assert (graded.soft, graded.hard) == (1.0, True)  # over what is graded here
    judged = graded.with_results([AssertionResult(index=1, type="llm-rubric", weight=2, status="failed", score=0.2,
                                                  reason="curt")])
    assert [r.status for r in judged.results] == ["passed", "failed", "needs_workspace"]
    assert judged.soft == pytest.approx(1 / 3) and judged.hard is False


def test_an_item_without_assertions():
    graded = grade("anything", make_item(expectations=("It is short",)))
    assert graded.results == () and graded.soft is None and graded.hard is None
    assert graded.item_id == "e1" and graded.expectations == ("It is short",)


# --- python checks --------------------------------------------------------------------------------------


def checks(tmp_path: Path, code: str, name: str = "checks.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


CODE = """
    import sys

    def yes(output, item):
        return "ok" in output

    def scored(output, item):
        return len(output) / 10

    def verdict(output, item):
        return {"pass": output.startswith("A"), "score": 0.7, "reason": f"item {item.id} checked"}

    def only_score(output, item):
        return {"score": 0.25}

    def boom(output, item):
        raise ValueError("no table in the output")

    def leave(output, item):
        sys.exit(3)

    def too_big(output, item):
        return 7

    def words(output, item):
        return "yes"

    def bad_pass(output, item):
        return {"pass": "yes"}

    def empty(output, item):
        return {"reason": "hm"}

    NOT_CALLABLE = 3
"""


@pytest.mark.parametrize(("function", "output", "threshold", "passed", "score", "reason"), [
    ("yes", "ok!", None, True, 1.0, "returned True"),
    ("yes", "no", None, False, 0.0, "returned False"),
    ("scored", "12345", None, True, 0.5, "returned 0.5 (passes at 0.5)"),
    ("scored", "1234", None, False, 0.4, "returned 0.4"),
    ("scored", "1234", 0.4, True, 0.4, "passes at 0.4"),
    ("verdict", "A", None, True, 0.7, "item e1 checked"),
    ("verdict", "B", None, False, 0.7, "item e1 checked"),
    ("only_score", "", 0.2, True, 0.25, "pass=True"),
    ("boom", "", None, False, 0.0, "raised ValueError: no table in the output"),
    ("leave", "", None, False, 0.0, "raised SystemExit: 3"),
    ("too_big", "", None, False, 0.0, "returned 7, not a score between 0 and 1"),
    ("words", "", None, False, 0.0, "returned str"),
    ("bad_pass", "", None, False, 0.0, "pass='yes'"),
    ("empty", "", None, False, 0.0, "without pass or score"),
    ("missing", "", None, False, 0.0, "has no function 'missing'"),
    ("NOT_CALLABLE", "", None, False, 0.0, "is not a function"),
])
def test_python_checks(tmp_path, function, output, threshold, passed, score, reason):
    checks(tmp_path, CODE)
    assertion: dict[str, Any] = {"type": "python", "value": f"file://checks.py:{function}"}
    if threshold is not None:
        assertion["threshold"] = threshold
    result = verdict(output, assertion, tmp_path)
    assert (result.passed, result.score) == (passed, score), result.reason
    assert reason in result.reason


def test_a_check_file_that_does_not_import(tmp_path):
    checks(tmp_path, "raise ImportError('needs pandas')\n", "broken.py")
    result = verdict("x", {"type": "python", "value": "broken.py:fn"}, tmp_path)
    assert result.passed is False and "cannot load broken.py:fn: ImportError: needs pandas" in result.reason


def test_a_changed_check_file_is_loaded_again(tmp_path):
    path = checks(tmp_path, "def f(output, item):\n    return True\n")
    assert verdict("x", {"type": "python", "value": "checks.py:f"}, tmp_path).passed
    path.write_text("def f(output, item):\n    return False\n")
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    assert not verdict("x", {"type": "python", "value": "checks.py:f"}, tmp_path).passed


def test_a_module_check(tmp_path, monkeypatch):
    checks(tmp_path, "def has_digits(output, item):\n    return any(c.isdigit() for c in output)\n",
           "skillstate_test_evals_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    assertion = {"type": "python", "value": "skillstate_test_evals_mod:has_digits"}
    assert verdict("a1", assertion).passed
    assert verdict("a", {**assertion, "type": "not-python"}).passed
    missing = verdict("a", {"type": "python", "value": "no_such_module_here:f"})
    assert missing.passed is False and "ModuleNotFoundError" in missing.reason


@SETTINGS
@given(st.one_of(st.booleans(), st.floats(allow_nan=True), st.integers(), st.text(max_size=3), st.none(),
                 st.dictionaries(st.sampled_from(["pass", "pass_", "score", "reason"]),
                                 st.one_of(st.booleans(), st.floats(), st.text(max_size=3), st.none()))),
       st.floats(0, 1))
def test_any_return_value_is_a_verdict(got, threshold):
    passed, score, reason = python_result(got, threshold)
    assert isinstance(passed, bool) and 0.0 <= score <= 1.0 and reason


def test_python_targets_are_checked_when_read(tmp_path):
    with pytest.raises(AssertionSpecError, match="not of the form"):
        parse_assertion({"type": "python", "value": "file://checks:fn"}, tmp_path)
    with pytest.raises(AssertionSpecError, match="does not exist"):
        parse_assertion({"type": "python", "value": "file://checks.py:fn"}, tmp_path)
