"""Property tests for the slow-update block (guidance, patch_skill), the edit
count clamp, accumulation batches, reflect minibatches and semantic density.

"Safe" texts use characters that never occur in the markers, plus whole
markers, so edits cannot cut a marker; the "broad" strategy also has marker
fragments and nested fragments, which stripping must not join into a marker."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from skillstate.engine.reflect import plan_minibatches
from skillstate.engine.update import patch_skill
from skillstate.log.events import Edit, ItemResult
from skillstate.skillopt.gate import semantic_density, with_density
from skillstate.skillopt.guidance import (
    END,
    LABELS,
    POLICIES,
    START,
    body_of,
    compare,
    guidance_of,
    label,
    protect,
    select_pairs,
    with_guidance,
)
from skillstate.skillopt.scheduler import clamp_edit_count, epoch_batches, steps_per_epoch

SETTINGS = settings(max_examples=120, deadline=None, database=None)
NESTED_END = "<!-- SLOW_UPDATE_" + END + "END -->"  # becomes END once the inner END is removed
NESTED_START = "<!-- SLOW_UPDATE_" + END + "START -->"

SAFE_WORDS = ["a", "b", "foo", "x.y", "é", "☃", "\t", "\n", "\n\n", START, END]
FRAGMENTS = ["<!--", "-->", "<!-- SLOW_UPDATE_", "START -->", "END -->", "SLOW_UPDATE_", " ", "- rule",
             "<!-- SLOW_UPDATE_START --", NESTED_END, NESTED_START]
safe_text = st.lists(st.sampled_from(SAFE_WORDS), max_size=10).map("".join)
broad_text = st.one_of(st.lists(st.sampled_from(SAFE_WORDS + FRAGMENTS), max_size=10).map("".join),
                       st.text(max_size=15))
OPS = st.one_of(st.sampled_from(["append", "insert_after", "replace", "delete"]),
                st.sampled_from(["", "APPEND", "remove", "noop"]))
KINDS = st.sampled_from(["line", "sub", "start", "end", "guidance", "lit", "empty"])

def specs(lit: st.SearchStrategy) -> st.SearchStrategy:
    """One edit sequence: (op, target spec, content spec); a spec picks a
    string from the current skill, the markers, the guidance or `lit`."""
    spec = st.tuples(KINDS, st.integers(0, 99), st.integers(0, 99), lit)
    return st.lists(st.tuples(OPS, spec, spec), max_size=6)

def resolve(spec, skill: str, guidance: str, safe: bool) -> str:
    kind, a, b, lit = spec
    if kind == "line":
        lines = skill.splitlines() or [""]
        return lines[a % len(lines)]
    if kind == "sub":
        src = body_of(skill) if safe else skill  # a slice of a marker could cut one
        i = a % (len(src) + 1)
        return src[i : i + b % (len(src) - i + 1)]
    return {"start": START, "end": END, "guidance": guidance, "lit": lit, "empty": ""}[kind]

def to_edits(seq, skill: str, guidance: str, safe: bool) -> list[Edit]:
    return [Edit(op=op, target=resolve(t, skill, guidance, safe), content=resolve(c, skill, guidance, safe))
            for op, t, c in seq]

def assert_one_block(text: str, guidance: str) -> None:
    assert text.count(START) == 1 and text.count(END) == 1
    assert text.index(START) < text.index(END)
    assert text.endswith(END + "\n")
    assert guidance_of(text) == guidance
    assert START not in body_of(text) and END not in body_of(text)

def run_updates(body: str, guidance: str, seqs, safe: bool) -> None:
    text = base = with_guidance(body, guidance)
    expected = guidance_of(base)
    assert expected is not None
    assert_one_block(base, expected)
    for seq in seqs:  # each update starts from the previous result
        text, report, _ = patch_skill(text, to_edits(seq, text, guidance, safe))
        assert len(report) == len(seq)
        assert_one_block(text, expected)

# -- the slow-update block ---------------------------------------------------

@SETTINGS
@given(safe_text, safe_text, st.lists(specs(safe_text), min_size=1, max_size=4))
def test_patch_keeps_exactly_one_block(body, guidance, seqs):
    run_updates(body, guidance, seqs, safe=True)

@settings(max_examples=60, deadline=None, database=None)
@given(broad_text, broad_text, st.lists(specs(broad_text), min_size=1, max_size=4))
@example("body", "g", [[("append", ("empty", 0, 0, ""), ("lit", 0, 0, NESTED_END))]])
@example("body", "g " + NESTED_END, [[]])
def test_patch_keeps_one_block_with_marker_fragments(body, guidance, seqs):
    run_updates(body, guidance, seqs, safe=False)

@SETTINGS
@given(safe_text, st.lists(specs(safe_text), min_size=1, max_size=4))
def test_patch_without_block_never_gains_a_marker(raw, seqs):
    text = body_of(raw)
    assert guidance_of(text) is None and START not in text and END not in text
    for seq in seqs:
        text, _, _ = patch_skill(text, to_edits(seq, text, "guidance", safe=True))
        assert START not in text and END not in text

def test_patch_no_edits_keeps_base_byte_for_byte():
    base = with_guidance("# Skill\n- rule\n", "slow")
    text, report, _ = patch_skill(base, [Edit(op="replace", target="absent", content="x"), Edit(op="zap")])
    assert text == base and [r.status for r in report] == ["skipped_absent", "skipped_unknown_op"]
    text, _, _ = patch_skill(base, [Edit(op="replace", target=START, content="")])
    assert text == base  # the body never contains the markers

def test_patch_example_edits_body_only():
    base = with_guidance("# Skill\n- rule one\n", "keep me")
    text, _, restored = patch_skill(base, [Edit(op="replace", target="keep me", content="gone"),
                                           Edit(op="append", content=END + "\nnew " + START),
                                           Edit(op="insert_after", target="rule one", content="- rule two")])
    assert text == "# Skill\n- rule one\n- rule two\n\n\nnew \n\n" + START + "\nkeep me\n" + END + "\n"
    assert restored

def test_patch_base_without_block_drops_stray_markers():
    text, _, _ = patch_skill("plain " + START, [])
    assert START not in text

def test_with_guidance_and_body_of_strip_nested_markers():
    assert END not in body_of(NESTED_END)
    assert with_guidance("body", "g " + NESTED_END).count(END) == 1

@SETTINGS
@given(safe_text | st.sampled_from(FRAGMENTS[:7]), safe_text, safe_text)
def test_with_guidance_replaces_never_duplicates(x, g1, g2):
    body = body_of(x)
    assert START not in body and END not in body
    once = with_guidance(x, g1)
    twice = with_guidance(once, g2)
    norm = g2.replace(START, "").replace(END, "").strip("\n")
    assert_one_block(twice, norm)
    assert guidance_of(with_guidance(x, g1)) == g1.replace(START, "").replace(END, "").strip("\n")
    # body_of gives the body back plus the separator with_guidance adds: "" when
    # the body is empty or ends in a blank line, else enough to end in "\n\n".
    back = body_of(twice)
    sep = "" if not body or body.endswith("\n\n") else ("\n" if body.endswith("\n") else "\n\n")
    assert back == body + sep
    assert back == "" or back.endswith("\n\n")
    assert with_guidance(x, None) == body
    assert with_guidance(twice, g2) == twice  # idempotent

@SETTINGS
@given(safe_text, st.one_of(st.none(), safe_text), safe_text)
def test_protect_keeps_base_guidance(base_body, guidance, candidate):
    base = with_guidance(base_body, guidance)
    fixed, restored = protect(base, candidate)
    assert guidance_of(fixed) == guidance_of(base)
    assert restored == (fixed != candidate)
    if guidance is None:
        assert START not in fixed and END not in fixed
    else:
        assert_one_block(fixed, guidance_of(base))

# -- clamp_edit_count --------------------------------------------------------

json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.sampled_from(["3", " 2.9 ", "-4", "nan", "inf", "-inf", "1e400", "x", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6)

def _number(value):
    try:
        return float(value.strip()) if isinstance(value, str) else None
    except ValueError:
        return None

@settings(max_examples=300, deadline=None, database=None)
@given(json_like, st.integers(0, 10**6))
def test_clamp_edit_count(value, candidates):
    out = clamp_edit_count(value, candidates)
    assert type(out) is int and 0 <= out <= candidates
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        assert out == 0
    elif isinstance(value, int):
        assert out == min(max(value, 0), candidates)
    elif isinstance(value, float) and not math.isfinite(value):
        assert out == 0
    elif isinstance(value, float):
        assert out == min(max(math.floor(value), 0), candidates)
    elif _number(value) is None or not math.isfinite(_number(value)):
        assert out == 0  # non-numeric string, "nan", "inf", overflow
    else:
        assert out == min(max(math.floor(_number(value)), 0), candidates)

def test_clamp_edit_count_examples():
    assert [clamp_edit_count(v, 5) for v in (3, 9, -2, 2.9, "4", True, None, [1], {"n": 1}, float("nan"))] \
        == [3, 5, 0, 2, 4, 0, 0, 0, 0, 0]
    assert clamp_edit_count(10**40, 7) == 7 and clamp_edit_count(float("inf"), 7) == 0

# -- epoch batches with accumulation, and reflect minibatches ----------------

ids_strategy = st.lists(st.integers(0, 10**6), unique=True, max_size=40).map(lambda xs: [f"i{x}" for x in xs])

@SETTINGS
@given(ids_strategy, st.integers(-5, 10**9), st.integers(0, 5), st.integers(1, 8), st.integers(1, 4))
def test_epoch_batches_pool_accumulation(ids, seed, epoch, bs, k):
    n = len(ids)
    steps = steps_per_epoch(n, bs, k)
    assert steps == max(1, -(-n // (bs * k)))
    batches = epoch_batches(ids, seed, epoch, bs, k)
    assert len(batches) == steps * k
    assert batches == epoch_batches(ids, seed, epoch, bs, k)
    m = -(-n // bs)
    first = batches[:m]
    assert sorted(i for b in first for i in b) == sorted(ids)
    assert all(0 < len(b) <= bs for b in first) and all(len(b) == bs for b in first[:-1])
    for b in batches[m:]:  # padding reuses batches of this epoch
        assert b in first if first else b == []

@SETTINGS
@given(ids_strategy, st.data(), st.integers(0, 99), st.integers(1, 8), st.integers(1, 4), st.integers(1, 5),
       st.booleans())
def test_minibatches_stay_within_sub_batches(ids, data, seed, bs, k, size, failure_only):
    hard = {i: data.draw(st.sampled_from([0.0, 1.0])) for i in ids}
    batches = epoch_batches(ids, seed, 1, bs, k)
    for s in range(steps_per_epoch(len(ids), bs, k)):
        for j, sub in enumerate(batches[s * k : (s + 1) * k]):
            results = [ItemResult(item_id=i, hard=hard[i], soft=0.5) for i in sub]
            plan = plan_minibatches(results, seed, s + 1, size, failure_only, sub_batch=j)
            assert plan == plan_minibatches(results, seed, s + 1, size, failure_only, sub_batch=j)
            for source in ("failure", "success"):
                chunks = [(idx, mb) for src, idx, mb in plan if src == source]
                assert [idx for idx, _ in chunks] == list(range(len(chunks)))
                assert all(0 < len(mb) <= size for _, mb in chunks)
                got = sorted(i for _, mb in chunks for i in mb)  # exactly once each
                wanted = [] if source == "success" and failure_only else \
                    sorted(i for i in sub if (hard[i] >= 1) == (source == "success"))
                assert got == wanted
            assert {src for src, _, _ in plan} <= {"failure", "success"}

# -- labels and pair selection -----------------------------------------------

def test_label_definitions():
    assert (label(0.0, 1.0), label(1.0, 0.0), label(0.0, 0.0), label(1.0, 1.0)) == \
        ("improved", "regressed", "persistent_fail", "stable_success")
    assert POLICIES == {"mixed": set(LABELS), "changed": {"improved", "regressed"},
                        "unchanged": {"persistent_fail", "stable_success"}}

@SETTINGS
@given(st.dictionaries(st.text(max_size=3), st.tuples(st.sampled_from([0.0, 1.0, None]), st.sampled_from([0.0, 1.0]))),
       st.sampled_from(sorted(POLICIES)))
def test_compare_and_select_pairs(items, policy):
    previous = [(i, b) for i, (b, _) in items.items() if b is not None]
    current = [(i, a) for i, (_, a) in items.items()]
    labels = compare(previous, current)
    names = {(0.0, 1.0): "improved", (1.0, 0.0): "regressed", (0.0, 0.0): "persistent_fail",
             (1.0, 1.0): "stable_success"}
    assert labels == {i: names[(b, a)] for i, (b, a) in items.items() if b is not None}
    kept = select_pairs(labels, policy)
    assert len(kept) == len(set(kept))
    assert set(kept) == {i for i, lab in labels.items() if lab in POLICIES[policy]}
    order = [(LABELS.index(labels[i]), i) for i in kept]
    assert order == sorted(order)  # regressions first, then ids in order within a label
    n_reg = sum(1 for i in kept if labels[i] == "regressed")
    assert all(labels[i] == "regressed" for i in kept[:n_reg])

# -- semantic density --------------------------------------------------------

DIRECTIVE = ["MUST validate input", "- Always check units", "NEVER: guess", "* should cite", "1. Avoid loops",
             "  Don't repeat", "Prefer, short answers", "ONLY. once", "require tests"]
PLAIN = ["Check the units", "- use tables", "mustard is yellow", "2) Compute it", "Never-ending story"]
SKIPPED = ["", "   ", "# Heading", "## MUST heading", "<!-- MUST comment -->", START, END, "- ", "12."]

@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["d", "p", "s"]), st.integers(0, 8)), max_size=12))
def test_semantic_density_counts_directive_lines(picks):
    pools = {"d": DIRECTIVE, "p": PLAIN, "s": SKIPPED}
    lines = [pools[kind][i % len(pools[kind])] for kind, i in picks]
    d = sum(1 for kind, _ in picks if kind == "d")
    p = sum(1 for kind, _ in picks if kind == "p")
    density = semantic_density("\n".join(lines))
    assert density == (d / (d + p) if d + p else 0.0)
    assert with_density(0.25, density, 0) == 0.25

@SETTINGS
@given(st.text(max_size=60), st.floats(-10, 10), st.floats(0, 5))
def test_semantic_density_bounds(text, score, weight):
    density = semantic_density(text)
    assert 0.0 <= density <= 1.0
    assert with_density(score, density, 0) == score
    assert score <= with_density(score, density, weight) <= score + weight + 1e-9

def test_semantic_density_examples():
    assert semantic_density("MUST a\n- Always b\nNEVER: c\n# Title\n\n<!-- note -->") == 1.0
    assert semantic_density("Check a\nuse b\n") == 0.0 and semantic_density("") == 0.0
    assert semantic_density("MUST a\nplain b") == 0.5
