"""`blocker_screened` in real runs on the sim's blocking mode: when a step's candidate loses at the gate and
none of its kept edits' types is left failing, the blocker search takes an edit the screen left out, aimed
at a type the candidate leaves failing, and ablates the current skill's lines with that edit alone. The run
is the same as without the key up to that search; replay --verify, audit and a fork that turns it off stay
exact; logs written before the key read it off."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_LOOP, small_config
from run_helpers import call

from skillstate.engine.review import review_edits
from skillstate.engine.runner import lineage_events
from skillstate.engine.update import patch_with
from skillstate.log.event_codec import decode, encode
from skillstate.log.reducer import RunState, reduce
from skillstate.reading.audit import audit, verify
from skillstate.skillopt.tree_edits import md_of
from skillstate.trainer import Trainer

SEED = 22  # (2 epochs of the sim's blocking mode: at step 5 the search puts an edit back, finds a clause, and the
#            gate takes the candidate as new best)


def _config(**kw):
    return small_config(**DEFAULT_LOOP, seed=SEED, sim={"noise": "blocking"}, **kw)


def _train(path, run_id: str, **kw):
    return Trainer(_config(**kw), db=f"sqlite:///{path / f'{run_id}.db'}", run_id=run_id).train()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("screened")
    return _train(path, "on"), _train(path, "off", blocker_screened=False), path


def _events(result, run_id: str) -> list:
    return [s.event for s in lineage_events(result.store, run_id)]


def _put_back(events: list) -> list:
    return [e for e in events if e.type == "BlockerSearched" and e.screened_index is not None]


def test_the_search_takes_an_edit_the_screen_left_out_and_ablates_with_it_alone(runs):
    on, _, _ = runs
    events = _events(on, "on")
    searches = _put_back(events)
    assert searches and any(s.found is not None for s in searches)
    for search in searches:
        step = [e for e in events if getattr(e, "step", None) == search.step]
        screened = next(e for e in step if e.type == "EditsScreened")
        selected = next(e for e in step if e.type == "EditsSelected")
        tried = next(t for t in screened.tried if t.index == search.screened_index)
        assert not tried.passed and tried.index not in selected.selected_indices
        assert tried.edit == search.screened_edit and search.task_type in tried.aimed_types
        assert search.task_type not in search.aimed_types  # no kept edit aimed at it
        current = md_of(on.store.get_blob(next(e for e in step if e.type == "RolloutCompleted").skill))
        new_content = [e.content for e in selected.edits if e.content and e.content not in current]
        for ablation in search.ablations:  # the current skill with the edit put back, the kept edits left out
            text = md_of(on.store.get_blob(ablation.skill))
            assert search.screened_edit.content in text
            assert not any(c in text for c in new_content if c not in search.screened_edit.content)
        if search.found is not None:
            at = step.index(search)
            built, gate = step[at + 1], step[-1]
            assert built.type == "CandidateBuilt" and built.skill == search.skill
            assert gate.type == "GateDecided" and f"with edit {search.screened_index} the screen left out alone" \
                in gate.reason
    assert verify(on.store, "on").ok and audit(on.store, "on").ok


def test_why_names_the_edit_put_back_as_the_one_the_step_applied(runs):
    on, _, path = runs
    search = next(s for s in _put_back(_events(on, "on")) if s.found is not None)
    gate = next(e for e in _events(on, "on") if e.type == "GateDecided" and e.step == search.step)
    assert gate.decision in ("accept", "accept_best")
    added = search.screened_edit.content.split(". ")[-1]  # the words the edit adds (a rule, or a paraphrase)
    assert added in on.best_skill
    why = json.loads(call("why", "on", added, "--json", "--db", f"sqlite:///{path / 'on.db'}"))
    assert why["changes"][0]["step"] == search.step and why["changes"][0]["change"] == "added"
    kept = why["origin"]["kept_edits"]
    assert [(k["op"], k["content"], k["status"]) for k in kept] == [
        (search.screened_edit.op, search.screened_edit.content, "applied")]


def test_a_review_of_that_step_lists_the_edit_put_back_and_the_removal_and_rebuilds_the_candidate(runs):
    """What a person is shown under `review` (and what dropping nothing rebuilds): the edits the candidate
    applies, here the edit put back and the line's removal, not the step's selected edits."""
    on, _, _ = runs
    state = RunState()
    for stored in lineage_events(on.store, "on"):
        if stored.event.type == "GateDecided" and state.progress is not None and state.progress.blocker is not None \
                and state.progress.blocker.screened_edit is not None and state.progress.blocker.found is not None:
            break
        state = reduce(state, stored.event)
    search, candidate = state.progress.blocker, state.progress.candidate
    rows = review_edits(_config(), state)
    assert [(r.origin, r.edit) for r in rows] == [("screened", search.screened_edit),
                                                  ("blocker", search.ablations[search.found].edit)]
    assert all(r.index is None and r.status is not None for r in rows)
    base = on.store.get_blob(state.progress.base_skill)
    assert on.store.get_blob(candidate.skill) == patch_with(_config(), base, [r.edit for r in rows])[0]


def test_show_step_keeps_the_first_candidate_apart_from_the_one_the_search_built(runs):
    on, _, path = runs
    search = next(s for s in _put_back(_events(on, "on")) if s.found is not None)
    db = f"sqlite:///{path / 'on.db'}"
    d = json.loads(call("show", "on", "--step", str(search.step), "--json", "--db", db))
    assert d["evaluation"]["partial"] is not None  # the step's own candidate, rejected early
    b = d["blocker"]
    assert b["screened"]["index"] == search.screened_index and b["screened"]["content"] == search.screened_edit.content
    assert b["found"]["line"] == search.ablations[search.found].line and b["task_type"] == search.task_type
    assert b["evaluation"]["partial"] is None and d["skills"]["searched"] == search.skill
    text = call("show", "on", "--step", str(search.step), "--db", db)
    assert "blocker search: without the" in text and "put back (left out by the screen)" in text
    assert "candidate without the line on val" in text


def test_without_the_key_the_run_is_the_same_up_to_the_search_that_puts_an_edit_back(runs):
    on, off, _ = runs
    first = _put_back(_events(on, "on"))[0]

    def before(events: list) -> list:  # the events after the first (it holds the config), up to that search
        end = next(k for k, e in enumerate(events) if e.type == "BlockerSearched" and e.step == first.step)
        return [(e.type, encode(e)) for e in events[1:end]]

    on_events, off_events = _events(on, "on"), _events(off, "off")
    assert before(on_events) == before(off_events)
    assert not _put_back(off_events)
    assert verify(off.store, "off").ok


def test_a_fork_that_turns_it_off_before_the_search_verifies(runs):
    on, _, path = runs
    step = _put_back(_events(on, "on"))[0].step
    db = f"sqlite:///{path / 'on.db'}"
    call("fork", "on", f"step_{step - 1}", "--set", "blocker_screened=false", "--run-id", "forked", "-q", "--db", db)
    forked = [s.event for s in lineage_events(on.store, "forked")]
    assert not _put_back([e for e in forked if getattr(e, "step", 0) >= step])
    report = verify(on.store, "forked")
    assert report.ok and report.checked == report.total


def test_logs_written_before_the_key_read_it_off():
    started = {"config": {"num_epochs": 1}, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f",
               "prompts": {}, "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    assert decode("RunStarted", 15, started).config["blocker_screened"] is False
    assert "blocker_screened" not in decode("RunStarted", 16, started).config  # a new run's defaults apply
    forked = {"parent_run_id": "p", "fork_step": 1, "parent_event_count": 3, "parent_event_hash": "h",
              "overrides": {}, "config": {"num_epochs": 1}, "prompts": {}, "steps_per_epoch": 1, "total_steps": 1}
    assert decode("RunForked", 13, forked).config["blocker_screened"] is False
