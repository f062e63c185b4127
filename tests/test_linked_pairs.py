"""A selection never leaves a link in SKILL.md pointing at nothing (issue 41, item 1): the edit that creates a
linked file joins the edit that links to it, or the link (or the removal of its file) is dropped as
`dangling_link`, and the log says which."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tree_training import Config, demo_tree, patch_md, tree_config

from skillstate.cli.render import selection_notes
from skillstate.engine.runner import lineage_events
from skillstate.engine.update import links_whole
from skillstate.log.events import CandidateBuilt, EditsSelected, RunStarted
from skillstate.log.values import Edit
from skillstate.reading.audit import audit, verify
from skillstate.reading.skill_text import stored_tree
from skillstate.skillopt.linked_pairs import DANGLING, dangling, keep_links_whole
from skillstate.skillopt.tree_edits import patch_tree
from skillstate.skilltree.bundle import bundle
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

LINK_B = Edit(op="insert_after", target="## Rules", content="- Dates: follow [references/b.md](references/b.md).")
CREATE_B = Edit(op="create", file="references/b.md", content="# B\n\n- Dates as YYYY-MM-DD.\n")
REMOVE_A = Edit(op="remove", file="references/a.md")
LINK_A = Edit(op="append", content="- See [references/a.md](references/a.md) first.")
PLAIN = Edit(op="append", content="- Answer in one line.")


def build(base):
    return lambda edits: patch_tree(base, edits, patch_md)[0]


def test_a_link_whose_file_was_left_out_brings_the_creation_in():
    base = demo_tree()
    edits = [CREATE_B, LINK_B, PLAIN]
    settled = keep_links_whole(base, edits, [1, 2], [0, 1, 2], build(base))
    assert settled.selected == [1, 2, 0] and settled.paired == [0] and settled.dropped == []
    assert dangling(build(base)([edits[i] for i in settled.selected])) == []


def test_a_link_to_a_file_no_kept_edit_creates_is_dropped():
    base = demo_tree()
    edits = [CREATE_B, LINK_B, PLAIN]
    settled = keep_links_whole(base, edits, [1, 2], [1, 2], build(base))  # the creation did not pass the screen
    assert settled.selected == [2] and settled.paired == []
    assert [(d.index, d.reason) for d in settled.dropped] == [(1, DANGLING)]


def test_removing_a_linked_file_is_dropped_and_a_selection_with_whole_links_is_left_alone():
    base = demo_tree(**{"SKILL.md": "---\nname: demo\ndescription: Answer.\n---\n# Demo\n\n## Rules\n"
                                    "- Read [references/a.md](references/a.md).\n"})
    edits = [REMOVE_A, PLAIN, CREATE_B, LINK_B]
    settled = keep_links_whole(base, edits, [0, 1], [0, 1, 2, 3], build(base))
    assert settled.selected == [1] and [(d.index, d.reason) for d in settled.dropped] == [(0, DANGLING)]
    whole = keep_links_whole(base, edits, [2, 3, 1], [0, 1, 2, 3], build(base))
    assert whole.selected == [2, 3, 1] and not whole.paired and not whole.dropped


def test_a_link_the_base_already_had_is_not_the_selections_doing():
    base = demo_tree(**{"SKILL.md": "---\nname: demo\ndescription: Answer.\n---\n# Demo\n\n## Rules\n"
                                    "- Read [references/gone.md](references/gone.md).\n"})
    settled = keep_links_whole(base, [PLAIN], [0], [0], build(base))
    assert settled.selected == [0] and not settled.dropped


POOL = [CREATE_B, LINK_B, REMOVE_A, LINK_A, PLAIN,
        Edit(op="create", file="references/c.md", content="# C\n\n- Units.\n"),
        Edit(op="append", content="- Units: [references/c.md](references/c.md), [references/b.md](references/b.md)."),
        Edit(op="remove", file="references/b.md")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(POOL) - 1), max_size=6, unique=True),
       st.lists(st.integers(0, len(POOL) - 1), max_size=8, unique=True))
def test_the_settled_selection_links_only_to_files_it_holds(selected, extra):
    base = demo_tree()
    eligible = sorted(set(selected) | set(extra))
    settled = keep_links_whole(base, POOL, selected, eligible, build(base))
    after = build(base)([POOL[i] for i in settled.selected])
    assert set(dangling(after)) <= set(dangling(base))
    assert set(settled.selected) <= set(eligible) and len(set(settled.selected)) == len(settled.selected)
    assert set(settled.paired) == set(settled.selected) - set(selected)
    assert {d.index for d in settled.dropped} == set(selected) - set(settled.selected)
    assert settled == keep_links_whole(base, POOL, selected, eligible, build(base))  # deterministic


def test_the_update_stage_records_the_pair_and_show_says_it():
    base = bundle(demo_tree())
    edits = [CREATE_B, LINK_B, PLAIN]

    class Patch(Config):
        update_mode = "patch"
        keep_links_whole = True

    picked = EditsSelected(step=1, budget=2, candidates=3, method="ranked", selected_indices=[1, 2],
                           edits=[LINK_B, PLAIN])
    out = links_whole(Patch, base, edits, [0, 1, 2], picked)
    assert out.selected_indices == [1, 2, 0] and out.paired == [0] and out.edits == [LINK_B, PLAIN, CREATE_B]
    assert out.model_dump(mode="json")["paired"] == [0] and "paired" not in picked.model_dump(mode="json")
    assert selection_notes(out) == ", 1 file kept with the link to it"
    alone = links_whole(Patch, base, edits, [1, 2], picked)
    assert alone.selected_indices == [2] and selection_notes(alone) == ", 1 left out for a link to nothing"
    assert links_whole(Patch, "# a markdown skill\n", edits, [0, 1, 2], picked) is picked


@pytest.fixture(scope="module")
def budget_one_run(tmp_path_factory):
    """A directory run whose budget is one edit a step: the sim's ranker prefers a pointer to a new reference
    over the edit that creates it."""
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('pairs') / 'runs.db'}")
    Trainer(tree_config(num_epochs=2, lr_scheduler="constant", edit_budget=1, min_edit_budget=1), store=store,
            run_id="p").train()
    yield store
    store.close()


def test_no_candidate_of_a_run_links_to_a_file_it_does_not_hold(budget_one_run):
    store = budget_one_run
    events = [e.event for e in lineage_events(store, "p")]
    started = next(e for e in events if isinstance(e, RunStarted))
    before = set(dangling(stored_tree(store, started.initial_skill)))
    built = [e for e in events if isinstance(e, CandidateBuilt) and e.changed]
    assert built
    for b in built:
        assert set(dangling(stored_tree(store, b.skill))) <= before
    selections = [e for e in events if isinstance(e, EditsSelected)]
    assert any(s.paired or any(d.reason == DANGLING for d in s.dropped) for s in selections)
    assert audit(store, "p").ok and verify(store, "p").ok


def test_a_run_logged_before_the_key_reads_it_off_and_selects_as_it_did():
    from skillstate.log.event_codec import decode

    config = {"num_epochs": 1}
    started = {"config": config, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f", "prompts": {},
               "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    assert decode("RunStarted", 11, started).config["keep_links_whole"] is False
    assert decode("RunStarted", 12, {**started, "config": {**config, "keep_links_whole": True}}
                  ).config["keep_links_whole"] is True
    base = bundle(demo_tree())

    class Old(Config):
        update_mode = "patch"
        keep_links_whole = False

    picked = EditsSelected(step=1, budget=2, candidates=3, method="ranked", selected_indices=[1, 2],
                           edits=[LINK_B, PLAIN])
    assert links_whole(Old, base, [CREATE_B, LINK_B, PLAIN], [0, 1, 2], picked) is picked
