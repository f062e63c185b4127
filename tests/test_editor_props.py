"""Property tests for skillstate.skillopt.editor: apply_edit / apply_edits.

Texts come from a small alphabet of words, spaces and newlines, and targets
are often slices of the text, so "target present" cases are common.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from skillstate.log.events import Edit
from skillstate.skillopt.editor import CHANGED, OPS, apply_edit, apply_edits

# Strategies here are heavier than in the other files; 100 examples keeps
# the file at a few seconds while still covering the interesting cases.
SETTINGS = settings(max_examples=100, deadline=None)

WORDS = ["a", "b", "ab", "foo", "bar", "- rule", "é", "☃", " ", "\n", "\n\n"]
UNKNOWN_OPS = ["", "APPEND", "insert", "remove", "noop", "replace ", "dëlete"]

pieces = st.lists(st.sampled_from(WORDS), max_size=12).map("".join)
texts = st.one_of(pieces, st.text(alphabet="ab \n☃", max_size=30))
contents = st.one_of(pieces, st.text(max_size=10))
ops = st.one_of(st.sampled_from(OPS), st.sampled_from(UNKNOWN_OPS), st.text(max_size=8))


@st.composite
def slice_of(draw, text: str) -> str:
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, len(text)))
    return text[i:j]


@st.composite
def text_and_target(draw) -> tuple[str, str]:
    """A text plus a target that is usually a substring of it."""
    text = draw(texts)
    target = draw(st.one_of(slice_of(text), slice_of(text), texts))
    return text, target


@st.composite
def text_and_present_target(draw) -> tuple[str, str]:
    text = draw(texts)
    target = draw(slice_of(text))
    assume(target)
    return text, target


@st.composite
def edits(draw, text: str | None = None) -> Edit:
    target = draw(slice_of(text)) if text is not None and draw(st.booleans()) else draw(texts)
    return Edit(op=draw(ops), target=target, content=draw(contents),
                source=draw(st.sampled_from(["failure", "success"])), support=draw(st.integers(0, 5)))


@st.composite
def text_and_edits(draw) -> tuple[str, list[Edit]]:
    text = draw(texts)
    return text, draw(st.lists(edits(text), max_size=6))


# -- never raises, determinism, status/change agreement ----------------------


@SETTINGS
@given(text_and_target(), ops, contents)
def test_any_edit_never_raises_and_status_matches_change(tt, op, content):
    text, target = tt
    new, status = apply_edit(text, Edit(op=op, target=target, content=content))
    assert isinstance(new, str)
    assert (status in CHANGED) == (new != text)


@SETTINGS
@given(text_and_target(), ops, contents)
def test_apply_edit_is_deterministic(tt, op, content):
    text, target = tt
    edit = Edit(op=op, target=target, content=content)
    assert apply_edit(text, edit) == apply_edit(text, edit)


@SETTINGS
@given(text_and_edits())
def test_apply_edits_report_matches_stepwise_application(te):
    text, edit_list = te
    final, report = apply_edits(text, edit_list)
    assert [e.index for e in report] == list(range(len(edit_list)))
    assert [e.op for e in report] == [e.op for e in edit_list]
    current = text
    for edit, entry in zip(edit_list, report, strict=True):
        new, status = apply_edit(current, edit)
        assert entry.status == status
        assert (entry.status in CHANGED) == (new != current)
        current = new
    assert final == current
    assert apply_edits(text, edit_list) == (final, report)


# -- per-op behaviour ---------------------------------------------------------


@SETTINGS
@given(texts, contents)
def test_append_ends_with_content(text, content):
    new, status = apply_edit(text, Edit(op="append", content=content))
    assert new.endswith(content)
    assert new.startswith(text)


@SETTINGS
@given(text_and_present_target(), contents)
def test_replace_touches_only_first_occurrence(tt, content):
    text, target = tt
    new, _ = apply_edit(text, Edit(op="replace", target=target, content=content))
    assert new == text.replace(target, content, 1)


@SETTINGS
@given(text_and_present_target())
def test_delete_touches_only_first_occurrence(tt):
    text, target = tt
    new, status = apply_edit(text, Edit(op="delete", target=target))
    i = text.find(target)
    end = i + len(target)
    plain = text[:i] + text[end:]
    whole_line = ((i == 0 or text[i - 1] == "\n") and text[end:end + 1] == "\n"
                  and not target.endswith("\n"))
    expected = text[:i] + text[end + 1:] if whole_line else plain
    assert new == expected
    assert new[:i] == text[:i]
    assert status == "applied"


@SETTINGS
@given(texts, contents, st.sampled_from(["replace", "delete"]))
def test_replace_delete_empty_target_skipped(text, content, op):
    assert apply_edit(text, Edit(op=op, target="", content=content)) == (text, "skipped_empty_target")


@SETTINGS
@given(texts, texts, contents, st.sampled_from(["replace", "delete"]))
def test_replace_delete_absent_target_skipped(text, target, content, op):
    assume(target and target not in text)
    assert apply_edit(text, Edit(op=op, target=target, content=content)) == (text, "skipped_absent")


@SETTINGS
@given(texts, texts, contents)
def test_insert_after_absent_or_empty_target_falls_back_to_append(text, target, content):
    assume(not target or target not in text)
    got = apply_edit(text, Edit(op="insert_after", target=target, content=content))
    appended = apply_edit(text, Edit(op="append", content=content))
    assert got == appended
    new, status = got
    if new != text:
        assert status == "appended"


@SETTINGS
@given(text_and_target(), contents, st.one_of(st.sampled_from(UNKNOWN_OPS), st.text(max_size=8)))
def test_unknown_op_skipped(tt, content, op):
    assume(op not in OPS)
    text, target = tt
    assert apply_edit(text, Edit(op=op, target=target, content=content)) == (text, "skipped_unknown_op")
