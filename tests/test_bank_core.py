"""Property and unit tests for skillstate.bank, the pure core of the skill
bank: the Bank, embeddings, dedup, retrieval, advantages, evolution planning,
the trajectory loader and the system message of retrieved skills."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.bank.advantages import group_advantages
from skillstate.bank.dedup import dedupe
from skillstate.bank.document import bank_text
from skillstate.bank.embedding import SimEmbedder, cosine, skill_text, task_text
from skillstate.bank.evolution import categories_to_evolve, failure_sample_plan
from skillstate.bank.export import render_skills
from skillstate.bank.retrieval import retrieve_embedding, retrieve_template
from skillstate.bank.skills import MAX_MISTAKES, Bank, BankSkill, Mistake, SkillProvenance, normalize_text, skill_id
from skillstate.bank.trajectories import load_trajectories
from skillstate.errors import UserError

SETTINGS = settings(max_examples=120, deadline=None)
EMBEDDER = SimEmbedder(64)
VOCAB = ["open", "door", "key", "heat", "apple", "check", "inventory", "look", "Take", "place!", "the", "cool"]
CATEGORIES = [None, "heat", "cool"]


def prov(refines: str | None = None) -> SkillProvenance:
    return SkillProvenance(trajectories=["t1"], origin="distill", step=1, refines=refines)


def make(title: str, principle: str, category: str | None = None, refines: str | None = None) -> BankSkill:
    return BankSkill.make(title, principle, category=category, provenance=prov(refines))


phrases = st.lists(st.sampled_from(VOCAB), min_size=0, max_size=6).map(" ".join)
titles = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=3).map(" ".join)


@st.composite
def skills(draw, refinable: list[str] | None = None) -> BankSkill:
    refines = draw(st.sampled_from([None, *refinable])) if refinable else None
    return make(draw(titles), draw(phrases), draw(st.sampled_from(CATEGORIES)), refines)


def unique_bank(items: list[BankSkill]) -> Bank:
    by_id = {s.id: s for s in items}
    return Bank(skills=tuple(by_id.values()))


@st.composite
def bank_and_proposals(draw) -> tuple[Bank, list[BankSkill]]:
    bank = unique_bank(draw(st.lists(skills(), max_size=8)))
    refinable = [s.id for s in bank.skills] + ["sk_missing"]
    return bank, draw(st.lists(skills(refinable), max_size=10))


def vec(skill: BankSkill) -> list[float]:
    return EMBEDDER.embed([skill_text(skill)])[0]


# -- skills and Bank ------------------------------------------------------------


def test_skill_tier_needs_matching_category():
    with pytest.raises(ValueError):
        BankSkill(id="x", title="t", principle="p", tier="task", category=None, provenance=prov())
    with pytest.raises(ValueError):
        BankSkill(id="x", title="t", principle="p", tier="general", category="heat", provenance=prov())
    assert make("t", "p", "heat").tier == "task" and make("t", "p").tier == "general"


def test_skill_id_is_content_hash_insensitive_to_case_and_punctuation():
    assert skill_id("Open  the Door!", "Use the key.") == skill_id("open the door", "use the KEY")
    assert skill_id("a", "b") != skill_id("a", "b", "heat") != skill_id("a", "c", "heat")
    assert skill_id("a", "b").startswith("sk_")


@SETTINGS
@given(st.lists(skills(), max_size=10))
def test_bank_tiers_partition_and_lookup(items):
    bank = unique_bank(items)
    parts = list(bank.general()) + [s for c in bank.categories() for s in bank.for_category(c)]
    assert sorted(s.id for s in parts) == sorted(s.id for s in bank.skills)
    assert all(bank.by_id(s.id) == s for s in bank.skills)
    assert bank.by_id("nope") is None
    assert bank.for_category(None) == ()


@SETTINGS
@given(st.lists(skills(), min_size=1, max_size=8), st.data())
def test_with_skills_appends_or_replaces_refined_in_place(items, data):
    bank = unique_bank(items)
    old = data.draw(st.sampled_from(bank.skills))
    refined = make(old.title, old.principle + " carefully now", old.category, refines=old.id)
    after = bank.with_skills([refined])
    index = bank.skills.index(old)
    assert len(after.skills) == len(bank.skills)
    assert after.skills[index] == refined and after.by_id(old.id) is None
    fresh = make("brand new title", "xyz", None)
    assert bank.with_skills([fresh]).skills == (*bank.skills, fresh)
    with pytest.raises(ValueError):
        bank.with_skills([old.model_copy(update={"title": "other"})])


MISTAKES = ["Look first", "look  FIRST", "x", " ", "Y", "y", "z"]
SCOPES = [None, "a", "b"]


@SETTINGS
@given(st.lists(st.lists(st.tuples(st.sampled_from(MISTAKES), st.sampled_from(SCOPES)), max_size=6), max_size=5),
       st.integers(0, 5))
def test_with_mistakes_dedupes_per_category_and_caps_each(batches, cap):
    bank = Bank()
    for batch in batches:
        bank = bank.with_mistakes([text if scope is None else Mistake(text=text, category=scope)
                                   for text, scope in batch if text.strip() or scope is None], cap=cap)
        keys = [(m.category, m.text.casefold()) for m in bank.mistakes]
        assert len(keys) == len(set(keys))
        assert all(sum(m.category == scope for m in bank.mistakes) <= cap for scope in SCOPES)
        assert all(m.text.strip() and m.text == " ".join(m.text.split()) for m in bank.mistakes)
        last = next(((" ".join(t.split()), c) for t, c in reversed(batch) if t.strip()), None)
        if last is not None and cap > 0:
            assert (bank.mistakes[-1].text, bank.mistakes[-1].category) == last
    assert len(Bank().with_mistakes([f"m{i}" for i in range(30)]).mistakes) == MAX_MISTAKES
    both = Bank().with_mistakes([f"m{i}" for i in range(30)] + [Mistake(text=f"c{i}", category="a") for i in range(30)])
    assert len(both.mistakes) == 2 * MAX_MISTAKES  # the cap is per category


def test_mistakes_keep_the_bare_text_form_of_banks_before_categories():
    old = '{"mistakes":["Look  first","Count twice"],"skills":[]}'
    bank = Bank.model_validate_json(old)
    assert [m.text for m in bank.mistakes] == ["Look  first", "Count twice"]  # as written: its blob is unchanged
    assert bank_text(bank) == old
    new = bank.with_mistakes([Mistake(text="Carry the one", category="arithmetic")])
    assert json.loads(bank_text(new))["mistakes"][-1] == {"category": "arithmetic", "text": "Carry the one"}
    assert Bank.model_validate_json(bank_text(new)) == new


def test_a_task_is_shown_its_categorys_and_the_general_mistakes_most_recent_first():
    bank = Bank().with_mistakes(["g1", Mistake(text="a1", category="a"), Mistake(text="b1", category="b"), "g2",
                                 Mistake(text="a2", category="a")])
    assert [m.text for m in bank.mistakes_for("a", 3)] == ["a2", "g2", "a1"]
    assert [m.text for m in bank.mistakes_for("c", 3)] == ["g2", "g1"]
    assert [m.text for m in bank.mistakes_for(None, 1)] == ["g2"]
    assert bank.mistakes_for("a", 0) == bank.mistakes  # every one, oldest first (runs before categories)


# -- embeddings -------------------------------------------------------------------

floats = st.floats(-1e300, 1e300, allow_nan=False)


@SETTINGS
@given(
    st.integers(1, 6).flatmap(
        lambda n: st.tuples(st.lists(floats, min_size=n, max_size=n), st.lists(floats, min_size=n, max_size=n))
    )
)
def test_cosine_is_finite_bounded_symmetric(pair):
    a, b = pair
    value = cosine(a, b)
    assert math.isfinite(value) and -1.0 <= value <= 1.0
    assert value == cosine(b, a)
    if any(a):
        assert cosine(a, a) == pytest.approx(1.0)
    assert cosine([0.0] * len(a), b) == 0.0


def test_cosine_odd_inputs():
    assert cosine([math.nan, 1.0], [1.0, 1.0]) == 0.0
    assert cosine([math.inf, 1.0], [1.0, 1.0]) == 0.0
    assert cosine([], []) == 0.0
    with pytest.raises(ValueError):
        cosine([1.0], [1.0, 2.0])


@SETTINGS
@given(phrases, phrases)
def test_sim_embedder_deterministic_unit_norm(a, b):
    va, vb = SimEmbedder(64).embed([a, b])
    assert va == EMBEDDER.embed([a])[0]
    norm = math.sqrt(sum(x * x for x in va))
    assert norm == pytest.approx(1.0) or norm == 0.0
    if norm:
        assert cosine(va, EMBEDDER.embed([a])[0]) == pytest.approx(1.0)


def test_sim_embedder_shared_words_are_more_similar():
    e = SimEmbedder()
    assert e.model == "sim-hash-256"
    base, near, far = e.embed(["heat the apple in the microwave", "Heat an apple with a microwave", "count letters"])
    assert cosine(base, near) > 0.5 > cosine(base, far)
    assert task_text("  open \n the  door ") == "open the door"
    assert skill_text(make("T", "P")) == "T\nP"


# -- dedup ----------------------------------------------------------------------


@SETTINGS
@given(bank_and_proposals(), st.floats(0.3, 0.97))
def test_dedupe_never_adds_a_near_duplicate(case, threshold):
    bank, proposed = case
    result = dedupe(bank, proposed, EMBEDDER.embed, threshold)
    after = bank.with_skills(result.added)  # never raises: no id clash
    for a in result.added:
        for s in after.skills:
            if s.id == a.id:
                continue
            assert cosine(vec(a), vec(s)) <= threshold
            overlap = a.tier == "general" or s.tier == "general" or a.category == s.category
            assert not (overlap and normalize_text(a.title) == normalize_text(s.title))
    for d in result.dropped:
        if d.reason == "similar":
            assert d.similarity is not None and d.similarity > threshold and d.similar_to


@SETTINGS
@given(bank_and_proposals(), st.data())
def test_dedupe_is_deterministic_and_order_respecting(case, data):
    bank, proposed = case
    result = dedupe(bank, proposed, EMBEDDER.embed)
    assert result == dedupe(bank, proposed, EMBEDDER.embed)
    decided = {id(s) for s in result.added} | {id(d.skill) for d in result.dropped}
    assert len(result.added) + len(result.dropped) == len(proposed) and decided == {id(s) for s in proposed}
    assert result.added == [s for s in proposed if any(s is a for a in result.added)]
    cut = data.draw(st.integers(0, len(proposed)))
    prefix = dedupe(bank, proposed[:cut], EMBEDDER.embed)
    assert prefix.added == [s for s in result.added if any(s is p for p in proposed[:cut])]


def test_dedupe_reasons_and_single_embed_call():
    bank = Bank(skills=(make("Check the inventory", "Look at what you carry before acting."),))
    calls: list[list[str]] = []

    def embed(texts: list[str]) -> list[list[float]]:
        calls.append(texts)
        return EMBEDDER.embed(texts)

    proposed = [
        make("  ", "x"),
        make("check THE inventory!", "Something else entirely", "heat"),
        make("Check inventory", "Look at what you carry before acting."),
        make("Heat with microwave", "Put the food in the microwave and heat it", "heat"),
        make("Heat with microwave", "Put the food in the microwave and heat it", "cool"),
    ]
    result = dedupe(bank, proposed, embed)
    assert [d.reason for d in result.dropped] == ["empty", "title_match", "similar", "similar"]
    assert result.added == [proposed[3]]
    assert len(calls) == 1 and len(calls[0]) == len(set(calls[0]))
    refined = make("Check the inventory", "Look at what you carry before every action.", refines=bank.skills[0].id)
    assert dedupe(bank, [refined], EMBEDDER.embed).added == [refined]


# -- retrieval ------------------------------------------------------------------

unit = st.floats(-1.0, 1.0, allow_nan=False)


@SETTINGS
@given(st.lists(skills(), max_size=10), st.sampled_from(CATEGORIES), st.integers(0, 8), st.floats(-1.0, 1.0), st.data())
def test_retrieve_embedding_top_k_above_threshold_sorted(items, category, k, threshold, data):
    bank = unique_bank(items)
    vectors = {s.id: data.draw(st.lists(unit, min_size=3, max_size=3)) for s in bank.skills}
    task = data.draw(st.lists(unit, min_size=3, max_size=3))
    floor = data.draw(st.integers(0, 8))
    got = retrieve_embedding(bank, category, task, vectors, k=k, threshold=threshold, min_k=floor)
    keys = [(-(r.similarity or 0.0), r.skill_id) for r in got]
    assert keys == sorted(keys)
    pool = {s.id for s in (*bank.for_category(category), *bank.general())}
    ranked = sorted((-cosine(task, vectors[i]), i) for i in pool)
    above = [pair for pair in ranked if -pair[0] > threshold]
    # the most similar first: all above the threshold, and never fewer than the floor allows, at most k
    assert keys == ranked[: min(k, max(len(above), min(floor, k)))]
    if floor == 0:
        assert all(r.similarity is not None and r.similarity > threshold for r in got)


def test_retrieve_embedding_defaults_and_missing_vector():
    bank = Bank(skills=(make("a", "b"),))
    with pytest.raises(KeyError):
        retrieve_embedding(bank, None, [1.0], {})
    assert retrieve_embedding(bank, None, [1.0], {bank.skills[0].id: [1.0]})[0].similarity == 1.0


@SETTINGS
@given(st.lists(skills(), max_size=12), st.sampled_from(CATEGORIES), st.integers(0, 8))
def test_retrieve_template_category_then_first_k_general(items, category, k):
    bank = unique_bank(items)
    got = [r.skill_id for r in retrieve_template(bank, category, k_general=k)]
    expected = [s.id for s in bank.for_category(category)] + [s.id for s in bank.general()[:k]]
    assert got == expected
    assert all(r.similarity is None for r in retrieve_template(bank, category))


# -- advantages -----------------------------------------------------------------

rewards = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@SETTINGS
@given(st.lists(rewards, min_size=1, max_size=32))
def test_advantages_zero_mean_unit_std_finite(group):
    adv = group_advantages(group)
    assert len(adv) == len(group) and all(math.isfinite(a) for a in adv)
    assert abs(math.fsum(adv) / len(adv)) <= 1e-9
    if any(adv):
        assert statistics.stdev(adv) == pytest.approx(1.0, abs=1e-9)  # the sample deviation, as TRL
    if max(group) - min(group) > 1e-9:
        assert any(adv)


@SETTINGS
@given(rewards, st.integers(1, 16))
def test_advantages_equal_rewards_give_zeros(value, n):
    assert group_advantages([value] * n) == [0.0] * n


def test_advantages_small_cases():
    assert group_advantages([]) == []
    assert group_advantages([0.7]) == [0.0]
    assert group_advantages([0.0, 1.0]) == pytest.approx([-0.5**0.5, 0.5**0.5])
    # TRL's GRPOTrainer: (r - mean) / std with torch's (n - 1) deviation, here 0.5 / sqrt(1/3)
    assert group_advantages([1.0, 0.0, 1.0, 0.0]) == pytest.approx([0.75**0.5, -(0.75**0.5)] * 2)
    with pytest.raises(ValueError):
        group_advantages([math.nan, 1.0])


# -- evolution planning ---------------------------------------------------------

names = st.sampled_from(["alpha", "beta", "gamma", "delta", "eps"])


@st.composite
def evolution_case(draw):
    rates = draw(st.dictionaries(names, st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.5, 0.9]), max_size=5))
    failures = {c: draw(st.lists(st.sampled_from([f"{c}{i}" for i in range(6)]), max_size=8)) for c in rates}
    threshold = draw(st.sampled_from([0.0, 0.2, 0.4, 0.6]))
    return rates, failures, threshold, draw(st.integers(0, 20)), draw(st.integers(0, 3))


@SETTINGS
@given(evolution_case())
def test_categories_to_evolve_worst_first(case):
    rates, _, threshold, _, _ = case
    got = categories_to_evolve(rates, threshold)
    assert set(got) == {c for c, r in rates.items() if r < threshold}
    assert got == sorted(got, key=lambda c: (rates[c], c))


@SETTINGS
@given(evolution_case())
def test_failure_sample_plan_round_robin_within_budget(case):
    rates, failures, threshold, budget, base = case
    plan = failure_sample_plan(rates, failures, threshold, budget, base)
    assert plan == failure_sample_plan(rates, failures, threshold, budget, base)
    order = categories_to_evolve(rates, threshold)
    assert list(plan) == [c for c in order if c in plan]
    assert sum(len(v) for v in plan.values()) <= budget
    quota = {c: min(len(set(failures[c])), 2 * base if rates[c] < threshold / 2 else base) for c in order}
    count = {c: len(plan.get(c, [])) for c in order}
    for c, ids in plan.items():
        assert ids == list(dict.fromkeys(failures[c]))[: len(ids)] and len(ids) <= quota[c]
    if sum(count.values()) < budget:
        assert count == quota
    for i, ci in enumerate(order):
        for cj in order[i + 1 :]:
            assert count[cj] <= count[ci] or count[ci] == quota[ci]
            assert count[ci] <= count[cj] + 1 or count[cj] == quota[cj]


def test_failure_sample_plan_example():
    rates = {"heat": 0.1, "cool": 0.3, "look": 0.9}
    failures = {"heat": ["h1", "h2", "h3", "h4", "h5"], "cool": ["c1", "c2", "c3"], "look": ["l1"]}
    everything = {"heat": ["h1", "h2", "h3", "h4"], "cool": ["c1", "c2"]}
    assert failure_sample_plan(rates, failures, 0.4, budget=100) == everything
    assert failure_sample_plan(rates, failures, 0.4, budget=3) == {"heat": ["h1", "h2"], "cool": ["c1"]}


# -- trajectories ---------------------------------------------------------------


def record(id: str = "t1", success: bool = True, **extra) -> dict:
    base = {
        "id": id,
        "task_description": "heat some apple and put it in the fridge",
        "task_category": "pick_heat_then_place",
        "steps": [
            {"observation": "You are in a kitchen.", "action": "go to microwave", "reward": 0.0, "step_index": 0},
            {"observation": "The microwave is closed.", "action": "open microwave", "step_index": 1},
        ],
        "total_reward": 1.0 if success else 0.0,
        "success": success,
        "metadata": {"source": "test"},
    }
    return {**base, **extra}


def test_load_trajectories_list_jsonl_and_single_object():
    records = [record("t1"), record("t2", success=False)]
    as_list = load_trajectories(json.dumps(records, indent=2))
    as_lines = load_trajectories("\n".join(json.dumps(r) for r in records) + "\n\n")
    assert as_list == as_lines and [t.id for t in as_list] == ["t1", "t2"]
    assert as_list[0].steps[1].reward == 0.0 and not as_list[1].success
    assert load_trajectories(json.dumps(record("t3"), indent=2))[0].id == "t3"
    assert load_trajectories("  \n") == []


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            json.dumps([record("ok"), record("bad", steps=[{"observation": "o", "step_index": 0}])]),
            "record 2 (id 'bad'): steps.0.action",
        ),
        (json.dumps(record("x")) + "\n{not json\n", "record 2 (line 2): not valid JSON"),
        (json.dumps([record("x"), 3]), "record 2: expected a JSON object"),
        (json.dumps([record("x"), record("x")]), "record 2 (id 'x'): duplicate id"),
        (json.dumps([record("y", typo_field=1)]), "record 1 (id 'y'): typo_field"),
        (json.dumps([{"task_description": "t"}]), "record 1: id"),
    ],
)
def test_load_trajectories_bad_record_is_one_line_user_error(text, expected):
    with pytest.raises(UserError) as info:
        load_trajectories(text)
    message = str(info.value)
    assert "\n" not in message and expected in message


# -- export ---------------------------------------------------------------------


def test_render_skills_lists_the_skills_then_the_mistakes():
    skill = make("Heat first", "Heat the object before placing it.", "pick_heat_then_place")
    text = render_skills([skill], ["Forgetting to open the microwave"])
    assert text.startswith("# Skills for this task") and "- **Heat first**: Heat the object" in text
    assert text.index("Heat first") < text.index("# Common mistakes to avoid") < text.index("Forgetting")
    assert render_skills([], ["m"]).startswith("# Common mistakes to avoid")
    assert render_skills([]) == ""
