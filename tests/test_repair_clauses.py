"""The repair by clauses (`repair_clauses`, on by default with `repair: ablate`):
the pure parts (cutting an edit into clauses, the verdict over whole edits and
clauses, the edits a repaired candidate applies) as properties, and a real run
on the sim's noisy world in which the repair leaves a clause out of an edit:
the repaired candidate is the one those edits build, replay --verify
reproduces it, and `show --step`, the dashboard and `why` say what was left
out."""

from __future__ import annotations

import json
from html import unescape

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import OLD_LOOP, call, log_of
from starlette.testclient import TestClient

from skillstate.config import SkillConfig
from skillstate.dashboard.app import create_app
from skillstate.engine.update import patch_skill
from skillstate.log.event_codec import decode
from skillstate.log.events_repair import EditsAblated
from skillstate.log.values import Edit
from skillstate.skillopt import clauses as cl
from skillstate.skillopt import repair
from skillstate.storage.store import Store

words = st.lists(st.sampled_from(["count", "the", "items", "first", "answer", "units", "check", "each"]),
                 min_size=1, max_size=5)
clause_text = words.map(lambda w: " ".join(w)).map(lambda s: s[0].upper() + s[1:])


@st.composite
def texts(draw):
    """Edit texts: lines with an optional list marker and one or more clauses
    joined by a semicolon or a full stop, with now and then a heading or a blank line."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["rule", "rule", "rule", "heading", "blank"]))
        if kind == "heading":
            lines.append("## " + draw(clause_text))
            continue
        if kind == "blank":
            lines.append("")
            continue
        parts = draw(st.lists(clause_text, min_size=1, max_size=3))
        body = parts[0]
        for part in parts[1:]:
            body += draw(st.sampled_from(["; ", ". "])) + part
        lines.append(draw(st.sampled_from(["", "- ", "* ", "1. "])) + body + ".")
    return "\n".join(lines)


def norm(clause: str) -> str:
    return clause.rstrip(".;").strip().lower()


@examples(full=300, sampled=60)
def test_leaving_out_a_clause_removes_that_clause_and_keeps_the_rest_and_the_plain_lines(max_examples):
    @given(texts(), st.data())
    @settings(max_examples=max_examples, deadline=None)
    def check(text, data):
        found = cl.clauses(text)
        if not found:
            with pytest.raises(IndexError):
                cl.without(text, 0)
            return
        k = data.draw(st.integers(0, len(found) - 1))
        out = cl.without(text, k)
        assert [norm(c) for c in cl.clauses(out)] == [norm(c) for j, c in enumerate(found) if j != k]
        plain = [ln for ln in text.split("\n") if not ln.strip() or ln.startswith("#")]
        if not out.strip():  # the only clause left out, and nothing but blank lines beside it
            assert len(found) == 1 and all(not ln.strip() for ln in plain)
            return
        lines = out.split("\n")
        assert [ln for ln in lines if not ln.strip() or ln.startswith("#")] == plain
        assert len(lines) in (len(text.split("\n")), len(text.split("\n")) - 1)

    check()


def test_a_rule_joined_to_another_by_a_semicolon_is_two_clauses_kept_as_a_list_line():
    line = "- Count from 1; for dates, add seven days at a time."
    assert cl.clauses(line) == ["Count from 1;", "for dates, add seven days at a time."]
    assert cl.without(line, 1) == "- Count from 1."
    assert cl.without(line, 0) == "- For dates, add seven days at a time."
    edit = Edit(op="insert_after", target="## Rules", content=line)
    assert repair.parts(edit) == 2 and repair.without_part(edit, 1).content == "- Count from 1."
    assert repair.parts(Edit(op="append", content="- One rule only.")) == 0
    deleted = repair.without_part(Edit(op="delete", target=line), 0)  # a delete keeps the clause left out of it
    assert (deleted.op, deleted.target, deleted.content) == ("replace", line, "- Count from 1.")


@st.composite
def clause_worlds(draw):
    """Edits of one to three clauses, one clause of which may be harmful (it
    breaks a set of items); outcomes are a function of the clauses present."""
    sizes = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(1, 4)))]
    n_items = draw(st.integers(1, 10))
    base = [draw(st.sampled_from([0.0, 0.5, 1.0])) for _ in range(n_items)]
    everything = frozenset((e, c) for e, n in enumerate(sizes) for c in range(n))
    bad = draw(st.sampled_from(sorted(everything)) | st.none())
    broken = draw(st.sets(st.integers(0, n_items - 1), min_size=1))

    def outcome(present: frozenset) -> list[float]:
        return [0.0 if bad in present and k in broken else base[k] for k in range(n_items)]

    return sizes, everything, bad, outcome


def units_of(sizes: list[int]) -> list[repair.Unit]:
    out: list[repair.Unit] = []
    for e, n in enumerate(sizes):
        out.append((e, None))
        out += [(e, c) for c in range(n)] if n >= 2 else []
    return out


def without_unit(everything: frozenset, unit: repair.Unit) -> frozenset:
    e, c = unit
    return frozenset(x for x in everything if x[0] != e or (c is not None and x[1] != c))


@settings(max_examples=300, deadline=None)
@given(clause_worlds())
def test_a_harmful_clause_is_left_out_rather_than_its_whole_edit_and_harmless_ones_never_are(world):
    sizes, everything, bad, outcome = world
    units = units_of(sizes)
    candidate = outcome(everything)
    found = repair.verdicts({u: outcome(without_unit(everything, unit)) for u, unit in enumerate(units)},
                            candidate, units)
    harmful = [units[v.index] for v in found if v.harmful]
    recovered = sum(a - c for a, c in zip(outcome(everything - {bad}) if bad else candidate, candidate, strict=True))
    if bad is None or recovered == 0:
        assert harmful == []
    elif sizes[bad[0]] >= 2:
        assert harmful == [bad]  # the clause, not the whole edit: the rest of the edit is kept
    else:
        assert harmful == [(bad[0], None)]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 5), st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=3, max_size=3),
                       min_size=1), st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=3, max_size=3))
def test_with_whole_edits_only_the_verdicts_are_those_of_the_whole_edit_repair(outcomes, candidate):
    units = [(i, None) for i in range(max(outcomes) + 1)]
    assert repair.verdicts(outcomes, candidate, units) == repair.verdicts(outcomes, candidate)


def test_clauses_are_on_by_default_old_logs_read_them_off_and_a_lone_edit_is_not_examined():
    assert SkillConfig().repair_clauses and SkillConfig().repair_prefix
    payload = {"config": {"repair": "ablate"}, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f",
               "prompts": {}, "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    old = decode("RunStarted", 6, payload).config
    assert old["repair_clauses"] is False and old["repair_prefix"] is False  # as they ran
    assert decode("RunStarted", 6, {**payload, "config": {"repair_clauses": True}}).config["repair_clauses"]
    line = Edit(op="append", content="- A; b.")
    assert repair.choose_units([0], [line], 3, True) == []  # a lone edit: the gate decides it as it is
    assert repair.choose_units([0, 1], [line, line], 3, True) == [(0, None), (0, 0), (0, 1), (1, None), (1, 0),
                                                                   (1, 1)]
    assert repair.choose_units([0, 1], [line, line], 3, False) == [(0, None), (1, None)]


# --- a real run ---------------------------------------------------------------------------------------------------

SEED = 1  # the sim world at this seed leaves a clause out at steps 3 and 6

@pytest.fixture(scope="module")
def trimmed(tmp_path_factory):
    """A noisy run of 2 epochs with the repair by clauses: it leaves a clause out of an edit."""
    db = f"sqlite:///{tmp_path_factory.mktemp('clauses') / 'c.db'}"
    call("run", "--run-id", "c", "--epochs", "2", "-q", "--set", "sim.noise=moderate", "--set", f"seed={SEED}",
         "--set", "drop_rejected_edits=0", *OLD_LOOP, "--db", db)
    return db


def test_the_repaired_candidate_applies_the_edit_without_its_harmful_clause(trimmed):
    db = trimmed
    log = log_of(db, "c")
    found = [e["payload"] for e in log if e["type"] == "EditsAblated" and e["payload"]["trimmed"]]
    assert found, "no clause was left out"
    store = Store(db)
    try:
        for a in found:
            ev = EditsAblated.model_validate(a)
            culprit = next(x for x in ev.ablations if x.harmful)
            assert culprit.part is not None and culprit.kept_as is not None and ev.trimmed == [culprit.index]
            assert ev.dropped == [] and culprit.recovered > 0
            step = [e for e in log if e["payload"].get("step") == ev.step]
            kinds = [e["type"] for e in step]
            at = kinds.index("EditsAblated")
            assert kinds[at + 1:] == ["CandidateBuilt", "CandidateEvaluated", "GateDecided"]
            selected = next(e["payload"] for e in step if e["type"] == "EditsSelected")
            base = store.get_blob(step[at + 1]["payload"]["base_skill"])
            edits = [Edit.model_validate(x) for x in selected["edits"]]
            text = patch_skill(base, repair.applied_after(edits, ev))[0]
            assert text == store.get_blob(ev.skill) == store.get_blob(step[at + 1]["payload"]["skill"])
            left_out = cl.clauses(culprit.edit.content)[culprit.part].rstrip(";.")
            assert left_out not in text and culprit.kept_as.content.strip().rstrip(".") in text
            assert f"left clause {culprit.part} out of edit {culprit.index}" in step[-1]["payload"]["reason"]
    finally:
        store.close()
    assert "reproduces all" in call("replay", "c", "--verify", "--db", db)


def test_show_the_dashboard_and_why_say_which_clause_was_left_out(trimmed):
    db = trimmed
    a = next(e["payload"] for e in log_of(db, "c") if e["type"] == "EditsAblated" and e["payload"]["trimmed"]
             and next(x for x in e["payload"]["ablations"] if x["harmful"])["edit"]["content"])
    culprit = next(x for x in a["ablations"] if x["harmful"])
    text = call("show", "c", "--step", str(a["step"]), "--db", db)
    assert "clause left out" in text and f"{culprit['index']}.{culprit['part']}" in text
    detail = json.loads(call("show", "c", "--step", str(a["step"]), "--json", "--db", db))
    assert detail["repair"]["trimmed"] == a["trimmed"]
    store = Store(db)
    try:
        with TestClient(create_app(store, allowed_hosts=["testserver"])) as client:
            html = unescape(client.get(f"/runs/c/steps/{a['step']}").text)
        assert "clause left out: did harm" in html and culprit["kept_as"]["content"] in html
    finally:
        store.close()
    left_out = cl.clauses(culprit["edit"]["content"])[culprit["part"]].rstrip(";.")
    why = call("why", "--db", db, "--", "c", left_out)
    assert f"step {a['step']}: left out by the repair" in why and ", ".join(a["affected_types"]) in why
