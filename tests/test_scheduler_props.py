"""Property tests for skillstate.skillopt.scheduler: edit budgets and epoch batches."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.skillopt.scheduler import edit_budget, epoch_batches, steps_per_epoch

SETTINGS = settings(max_examples=200, deadline=None)

kinds = st.sampled_from(["constant", "linear", "cosine"])
decaying = st.sampled_from(["linear", "cosine"])


@st.composite
def budgets(draw) -> tuple[int, int, int]:
    """(total_steps, max_budget, min_budget) with 1 <= min <= max <= 20."""
    lo = draw(st.integers(1, 20))
    hi = draw(st.integers(lo, 20))
    return draw(st.integers(1, 200)), hi, lo


# -- edit_budget --------------------------------------------------------------


@SETTINGS
@given(budgets(), kinds, st.data())
def test_budget_is_int_within_bounds(b, kind, data):
    total, hi, lo = b
    step = data.draw(st.integers(0, total))
    value = edit_budget(step, total, hi, lo, kind)
    assert type(value) is int
    assert lo <= value <= hi


@SETTINGS
@given(budgets(), decaying)
def test_budget_monotone_non_increasing(b, kind):
    total, hi, lo = b
    values = [edit_budget(s, total, hi, lo, kind) for s in range(total + 1)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


@SETTINGS
@given(budgets(), decaying)
def test_budget_endpoints(b, kind):
    total, hi, lo = b
    assert edit_budget(0, total, hi, lo, kind) == hi
    assert edit_budget(total, total, hi, lo, kind) == lo


@SETTINGS
@given(budgets(), st.data())
def test_constant_budget_is_max(b, data):
    total, hi, lo = b
    step = data.draw(st.integers(0, total))
    assert edit_budget(step, total, hi, lo, "constant") == hi


# -- epoch_batches --------------------------------------------------------------

ids_lists = st.lists(st.text(alphabet="abcxyz0123", min_size=1, max_size=4), min_size=1, max_size=30, unique=True)
seeds = st.integers(0, 2**32)
epochs = st.integers(1, 50)
batch_sizes = st.integers(1, 12)
# Drawing id lists is the slow part; 100 examples is plenty for these.
EPOCH_SETTINGS = settings(max_examples=100, deadline=None)


@EPOCH_SETTINGS
@given(ids_lists, seeds, epochs, batch_sizes)
def test_epoch_is_a_permutation_in_the_right_number_of_batches(ids, seed, epoch, bs):
    batches = epoch_batches(ids, seed, epoch, bs)
    assert len(batches) == steps_per_epoch(len(ids), bs)
    flat = [i for batch in batches for i in batch]
    assert Counter(flat) == Counter(ids)
    assert all(1 <= len(batch) <= bs for batch in batches)


@EPOCH_SETTINGS
@given(ids_lists, seeds, epochs, batch_sizes, st.integers(1, 4))
def test_epoch_batches_deterministic(ids, seed, epoch, bs, acc):
    assert epoch_batches(ids, seed, epoch, bs, acc) == epoch_batches(list(ids), seed, epoch, bs, acc)


@EPOCH_SETTINGS
@given(ids_lists, seeds, epochs, batch_sizes, st.integers(2, 5))
def test_accumulation_batch_count(ids, seed, epoch, bs, acc):
    batches = epoch_batches(ids, seed, epoch, bs, acc)
    assert len(batches) == steps_per_epoch(len(ids), bs, acc) * acc
    # Padding reuses batches, so every id still appears and nothing new does.
    assert set(i for batch in batches for i in batch) == set(ids)


@EPOCH_SETTINGS
@given(seeds, epochs, batch_sizes, st.integers(1, 4))
def test_empty_id_list_gives_steps_per_epoch_batches(seed, epoch, bs, acc):
    # steps_per_epoch(0, ...) is 1, so an empty train split still has one step.
    batches = epoch_batches([], seed, epoch, bs, acc)
    assert len(batches) == steps_per_epoch(0, bs, acc) * acc
    assert all(batch == [] for batch in batches)
