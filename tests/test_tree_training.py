"""Training a whole skill directory (issue 23, §2): with `train_files: all` (the default with
`disclosure: tools`) the run's skill is the tree, stored as a tree blob and its file blobs; edits
name the file they change, `create` and `remove` add and delete references, and readers show the
tree file by file."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, small_config
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import call
from test_inputs_config import refused

from skillstate.engine.runner import lineage_events
from skillstate.engine.update import patch_skill, patch_with, screen
from skillstate.log.events import CandidateBuilt, RunStarted
from skillstate.log.events_epoch import SlowUpdateProposed
from skillstate.log.reducer import RunState
from skillstate.log.values import Edit
from skillstate.reading.audit import audit, verify
from skillstate.reading.skill_text import skill_text
from skillstate.skillopt.editor import CHANGED
from skillstate.skillopt.guidance import START, front_of
from skillstate.skillopt.tree_edits import (
    file_problem,
    is_skill_md_edit,
    md_of,
    patch_tree,
    screen_file_edits,
    shown,
    with_md,
)
from skillstate.skilltree import SkillFile, SkillTree, is_tree_blob, load_skill, parse_front_matter, validate_skill
from skillstate.skilltree.bundle import bundle, is_bundle, unbundle, view, view_files
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

SKILLS = EXAMPLES / "skills"
TRAINED = SKILLS / "exact-answers"
DISTRACTORS = [SKILLS / "distractors" / "number-words", SKILLS / "distractors" / "calendar-notes"]
FRONT = "---\nname: demo\ndescription: Answer questions.\n---\n"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00binary"


def demo_tree(**extra: str) -> SkillTree:
    files = {"SKILL.md": SkillFile.of_text(FRONT + "# Demo\n\n## Rules\n- Be exact.\n"),
             "references/a.md": SkillFile.of_text("# A\n\n- First rule.\n"),
             "scripts/run.py": SkillFile.of_text("print('hi')\n", executable=True),
             "assets/logo.png": SkillFile(PNG)}
    files.update({path: SkillFile.of_text(text) for path, text in extra.items()})
    return SkillTree(files)


def patch_md(md: str, edits: list[Edit]):
    return patch_skill(md, edits, True, True)


class Config:  # what patch_with and screen read of a run's config
    protect_front_matter = True
    disclosure = "tools"
    drop_noop_edits = True
    drop_rejected_edits = 0


# --- the tree in one text ------------------------------------------------------------------------

def test_a_bundle_holds_every_file_byte_for_byte_and_the_view_shows_the_text_ones():
    tree = demo_tree()
    text = bundle(tree)
    assert is_bundle(text) and unbundle(text) == tree and unbundle(text)["scripts/run.py"].executable
    shown_files = view_files(view(tree))
    assert list(shown_files) == ["SKILL.md", "references/a.md", "scripts/run.py"]  # SKILL.md first, no binary
    assert shown_files["references/a.md"] == "# A\n\n- First rule."
    assert 'assets/logo.png" binary=' in view(tree)
    assert md_of(text) == tree["SKILL.md"].text and md_of("# plain\n") == "# plain\n"
    assert shown(text) == view(tree) and shown(text, whole=False) == tree["SKILL.md"].text


# --- edits across files --------------------------------------------------------------------------

@pytest.mark.parametrize(("edit", "reason"), [
    (Edit(op="append", content="x", file="../outside.md"), "bad_path"),
    (Edit(op="append", content="x", file="/etc/passwd"), "bad_path"),
    (Edit(op="create", content="x", file="references/../../x.md"), "bad_path"),
    (Edit(op="create", content="x", file="scripts/new.py"), "outside_references"),
    (Edit(op="create", content="x", file="references/a.md"), "file_exists"),
    (Edit(op="create", content="  ", file="references/b.md"), "empty_content"),
    (Edit(op="create", content="x", file="references/a.md/b.md"), "bad_path"),
    (Edit(op="remove", file="scripts/run.py"), "outside_references"),
    (Edit(op="remove", file="references/zz.md"), "no_such_file"),
    (Edit(op="append", content="x", file="assets/logo.png"), "binary_file"),
    (Edit(op="append", content="x", file="references/zz.md"), "no_such_file"),
    (Edit(op="describe", content="x", file="references/a.md"), "unknown_op"),
])
def test_an_edit_of_a_file_it_may_not_touch_is_skipped_with_its_reason(edit, reason):
    tree = demo_tree()
    assert file_problem(tree, edit) == reason
    after, report, _ = patch_tree(tree, [edit], patch_md)
    assert after == tree and report[0].status == f"skipped_{reason}"


def test_edits_apply_across_files_in_order_with_one_report_entry_each():
    edits = [Edit(op="append", content="- Second rule.", file="references/a.md"),
             Edit(op="insert_after", target="## Rules", content="- See [references/b.md](references/b.md)."),
             Edit(op="create", content="# B\n\n- New.\n", file="references/b.md"),
             Edit(op="describe", content="Answer questions and sort lists."),
             Edit(op="replace", target="First", content="Main", file="./references/a.md"),
             Edit(op="remove", file="references/b.md"),
             Edit(op="create", content="# C\n", file="references/c.md")]
    tree, report, restored = patch_tree(demo_tree(), edits, patch_md)
    assert [r.index for r in report] == list(range(len(edits))) and not restored
    assert all(r.status in CHANGED for r in report), report
    assert tree["references/a.md"].text == "# A\n\n- Main rule.\n- Second rule."
    assert "references/b.md" not in tree and tree["references/c.md"].text == "# C\n"
    md = tree["SKILL.md"].text
    assert "description: Answer questions and sort lists." in md and "- See [references/b.md]" in md
    assert tree["scripts/run.py"] == demo_tree()["scripts/run.py"] and tree["assets/logo.png"].data == PNG


def test_the_screen_drops_file_edits_that_cannot_apply_or_change_nothing_and_keeps_the_indexes():
    base = bundle(demo_tree())
    edits = [Edit(op="append", content="- Be exact."),  # already in SKILL.md
             Edit(op="append", content="- New.", file="references/a.md"),
             Edit(op="create", content="x", file="scripts/x.py"),
             Edit(op="replace", target="absent", content="y", file="references/a.md"),
             Edit(op="append", content="- New.", file="references/a.md"),
             Edit(op="append", content="- Be brief.")]
    kept, dropped = screen(Config, RunState(), base, edits)
    assert kept == [1, 5]
    assert [(d.index, d.reason) for d in dropped] == [(0, "already_in_skill"), (2, "outside_references"),
                                                      (3, "skipped_absent".removeprefix("skipped_")),
                                                      (4, "duplicate")]
    assert screen_file_edits(demo_tree(), edits, [1, 4])[0] == [1]


def test_patch_with_keeps_a_bundle_a_bundle_and_a_markdown_skill_markdown():
    edit = Edit(op="append", content="- Z.", file="references/a.md")
    text, report, _ = patch_with(Config, bundle(demo_tree()), [edit])
    assert is_bundle(text) and unbundle(text)["references/a.md"].text.endswith("- Z.")
    assert report[0].status == "appended"
    text, report, _ = patch_with(Config, FRONT + "# x\n", [edit])
    assert text == FRONT + "# x\n- Z."  # a markdown run has one file: `file` is not read there


paths = st.sampled_from(["", "SKILL.md", "references/a.md", "references/new.md", "references/deep/n.md",
                         "scripts/run.py", "assets/logo.png", "../x.md", "/abs.md", "references", "a\\b.md"])
ops = st.sampled_from(["append", "insert_after", "replace", "delete", "create", "remove", "describe", "rewrite"])
texts = st.sampled_from(["", "- Be exact.", "## Rules", "---", "name: other", START, "First", "# A", "x\ny"])


@given(st.lists(st.builds(lambda op, target, content, file: Edit(op=op, target=target, content=content, file=file),
                          ops, texts, texts, paths), max_size=8))
@settings(max_examples=300, deadline=None)
def test_no_sequence_of_edits_breaks_the_skill_or_leaves_its_directory(edits):
    before = demo_tree()
    tree, report, _ = patch_tree(before, edits, patch_md)
    assert [r.index for r in report] == list(range(len(edits)))
    assert validate_skill(tree, "demo").ok  # the name and front matter stay valid
    fields = dict(parse_front_matter(tree["SKILL.md"].text).fields)  # only describe changes the front matter
    assert fields.pop("name") == "demo" and set(fields) == {"description"}
    if not any(e.op == "describe" and is_skill_md_edit(e) for e in edits):
        assert front_of(tree["SKILL.md"].text) == front_of(before["SKILL.md"].text)
    assert tree["assets/logo.png"] == before["assets/logo.png"]  # binary assets are never edited
    assert tree["scripts/run.py"] == before["scripts/run.py"] or any(e.file == "scripts/run.py" for e in edits)
    assert all(p in before or p.startswith("references/") for p in tree)  # new files only under references/
    assert all(p in tree or p.startswith("references/") for p in before)  # only references are removed
    if not any(r.status in CHANGED for r in report):
        assert tree == before


# --- runs ----------------------------------------------------------------------------------------

def tree_config(**kw):
    return small_config(**{"initial_skill": str(TRAINED), "disclosure": "tools",
                           "distractor_skills": [str(p) for p in DISTRACTORS], **kw})


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('tree') / 'runs.db'}")
    Trainer(tree_config(num_epochs=1), store=store, run_id="t").train()
    return store


def test_a_run_with_disclosure_tools_trains_every_file_and_stores_each_skill_as_a_tree(tree_run):
    events = lineage_events(tree_run, "t")
    started = events[0].event
    assert isinstance(started, RunStarted) and is_tree_blob(tree_run.get_blob(started.initial_skill))
    built = [e.event for e in events if isinstance(e.event, CandidateBuilt) and e.event.changed]
    assert built and all(is_tree_blob(tree_run.get_blob(b.skill)) for b in built)
    summary = json.loads(call("show", "t", "--json", "--db", tree_run.url))
    assert summary["skill_tree"]["trained"] == "all" and summary["best_score"] > summary["baseline_score"]
    assert "every file is trained" in call("show", "t", "--db", tree_run.url)
    assert audit(tree_run, "t").ok
    report = verify(tree_run, "t")
    assert report.ok and report.checked == report.total


def test_diff_why_and_export_read_the_tree_file_by_file(tree_run, tmp_path):
    summary = json.loads(call("show", "t", "--json", "--db", tree_run.url))
    best = view_files(call("export", "t", "--db", tree_run.url))  # a markdown export is the tree's view
    new = [p for p in best if not (TRAINED / p).exists()]
    assert new and all(p.startswith("references/") for p in new)  # the run created references
    diff = call("diff", "t", "0", str(summary["best_step"]), "--db", tree_run.url)
    assert "--- t@step_0/SKILL.md" in diff
    assert f"--- /dev/null\n+++ t@step_{summary['best_step']}/{new[0]}" in diff
    line = best[new[0]].splitlines()[-1].lstrip("- ")
    where = next(ln for ln in call("why", "t", line, "--db", tree_run.url).splitlines()
                 if ln.startswith("  in the current skill's "))
    assert new[0] in where
    call("export", "t", "--into", str(tmp_path), "--db", tree_run.url)
    exported = tmp_path / "exact-answers"
    assert (exported / new[0]).read_text().rstrip("\n") == best[new[0]]
    script = "scripts/count_letters.py"
    assert (exported / script).read_bytes() == (TRAINED / script).read_bytes()


def test_a_damaged_reference_blob_of_a_trained_tree_fails_the_audit(tree_run, tmp_path):
    import shutil

    import sqlalchemy as sa

    from skillstate.engine.loading import load_run
    from skillstate.skilltree.blobs import manifest_entries

    copy = tmp_path / "copy.db"
    shutil.copy(tree_run.url.removeprefix("sqlite:///"), copy)
    store = Store(f"sqlite:///{copy}")
    root = store.get_blob(load_run(store, "t").state.best_skill)
    victim = manifest_entries(root)["references/reading.md"]["blob"]
    with store.engine.begin() as conn:
        conn.execute(sa.text("delete from blobs where hash = :h"), {"h": victim})
    assert not audit(store, "t").ok


@pytest.mark.parametrize("mode", ["rewrite", "full_rewrite"])
def test_the_rewrite_modes_rewrite_skill_md_and_keep_the_other_files(tmp_path, mode):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    Trainer(tree_config(num_epochs=1, update_mode=mode), store=store, run_id="r").train()
    built = [e.event for e in lineage_events(store, "r") if isinstance(e.event, CandidateBuilt) and e.event.changed]
    assert built and all(b.method == mode for b in built)
    for b in built:
        files = view_files(skill_text(store, b.skill))
        assert {p: files[p] for p in files if p != "SKILL.md"} == {
            p: t for p, t in view_files(view(load_skill(TRAINED).tree)).items() if p != "SKILL.md"}


def test_the_slow_update_keeps_its_block_in_skill_md(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    Trainer(tree_config(num_epochs=2, use_slow_update=True), store=store, run_id="s").train()
    proposed = [e.event for e in lineage_events(store, "s") if isinstance(e.event, SlowUpdateProposed)
                and e.event.skill is not None]
    assert proposed
    files = view_files(skill_text(store, proposed[0].skill))
    assert START in files["SKILL.md"] and not any(START in t for p, t in files.items() if p != "SKILL.md")


def test_train_files_is_checked_and_fixed_on_fork(tmp_path, tree_run):
    db = tmp_path / "x.db"
    refused(db, "run", "--set", f"initial_skill={TRAINED}", "--set", "train_files=all",
            match="train_files: all needs disclosure: tools")
    refused(db, "run", "--set", "disclosure=tools", "--set", "train_files=all",
            match="disclosure: tools installs an Agent Skills skill")  # a markdown skill has no other files
    out = call("fork", "t", "step_1", "--set", "train_files=skill_md", "--db", tree_run.url, code=2)
    assert "train_files" in out


def test_train_files_skill_md_trains_skill_md_alone_as_before(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'm.db'}")
    Trainer(tree_config(num_epochs=1, train_files="skill_md"), store=store, run_id="m").train()
    started = lineage_events(store, "m")[0].event
    assert isinstance(started, RunStarted) and not is_tree_blob(store.get_blob(started.initial_skill))
    files = {e["file"] for step in range(1, 4)
             for e in json.loads(call("show", "m", "--step", str(step), "--json", "--db", store.url))
             .get("selected", {}).get("edits", [])}
    assert files <= {"SKILL.md", "SKILL.md (description)"}


def test_the_dashboard_shows_the_tree_file_by_file(tree_run):
    from starlette.testclient import TestClient

    from skillstate.dashboard.app import create_app

    summary = json.loads(call("show", "t", "--json", "--db", tree_run.url))
    with TestClient(create_app(tree_run, allowed_hosts=["testserver"])) as client:
        html = client.get("/runs/t/skill").text
        assert '<h2 class="skill-file"><code>SKILL.md</code></h2>' in html
        assert '<code>references/reading.md</code>' in html and "<file path=" not in html
        step = client.get(f"/runs/t/steps/{summary['best_step']}").text
        assert '<div class="dl file"><code>SKILL.md</code></div>' in step and "&lt;file path=" not in step


# --- review fixes ----------------------------------------------------------------------------------

def test_a_nul_a_model_writes_is_dropped_never_a_crash():
    edits = [Edit(op="append", content="- A\x00B."), Edit(op="append", content="- C\x00.", file="references/a.md"),
             Edit(op="create", content="# N\x00\n", file="references/n.md"),
             Edit(op="append", content="\x00", file="references/a.md")]
    tree, report, _ = patch_tree(demo_tree(), edits, patch_md)
    assert "- AB." in tree["SKILL.md"].text and tree["references/a.md"].text.endswith("- C.")
    assert tree["references/n.md"].text == "# N\n" and report[3].status == "unchanged"
    assert "\x00" not in md_of(with_md(bundle(demo_tree()), FRONT + "x\x00y\n"))


def test_a_lookalike_of_skill_md_is_skill_md_and_keeps_its_protections():
    kelvin = "S\u212aILL.md"  # a Kelvin sign for the K: the same path once normalized
    edit = Edit(op="replace", target="name: demo", content="name: hacked", file=kelvin)
    assert is_skill_md_edit(edit)
    tree, report, _ = patch_tree(demo_tree(), [edit], patch_md)
    assert "name: demo" in tree["SKILL.md"].text and report[0].status not in CHANGED


def test_scripts_are_never_edited():
    edit = Edit(op="append", content="import os; os.system('x')", file="scripts/run.py")
    assert file_problem(demo_tree(), edit) == "executable_file"


def test_an_edit_rejected_in_one_file_is_not_taken_for_the_same_edit_of_another():
    from types import MappingProxyType, SimpleNamespace

    rejected = Edit(op="append", content="- New.", file="references/a.md")
    state = RunState(rejected_edits=MappingProxyType({(rejected.keyed_op, rejected.target, rejected.content): 1}))
    config = SimpleNamespace(**{**{k: getattr(Config, k) for k in dir(Config) if not k.startswith("_")},
                                "drop_rejected_edits": 1})
    edits = [Edit(op="append", content="- New."), rejected, Edit(op="append", content="- New.", file="references/b.md")]
    kept, dropped = screen(config, state, bundle(demo_tree(**{"references/b.md": "# B\n"})), edits)
    assert kept == [0, 2] and [(d.index, d.reason) for d in dropped] == [(1, "rejected_before")]


def test_runs_logged_before_train_files_read_it_as_skill_md():
    from skillstate.log.event_codec import decode

    started = decode("RunStarted", 9, {"config": {"disclosure": "tools"}, "initial_skill": "h", "dataset": {},
                                       "dataset_fingerprint": "f", "prompts": {}, "steps_per_epoch": 1,
                                       "total_steps": 1, "package_version": "x"})
    assert started.config["train_files"] == "skill_md"


def test_the_gate_measures_skill_md_of_a_tree():
    from skillstate.engine.scoring import summarize
    from skillstate.skillopt.gate import length_cost, semantic_density

    text = bundle(demo_tree())
    scores = summarize([], "hard", 0.5, text, 0.1, 0.01)
    md = demo_tree()["SKILL.md"].text
    assert scores.density == semantic_density(md) and scores.length_cost == length_cost(md, 0.01)


def test_a_markdown_skill_that_shows_a_file_block_is_still_markdown(tmp_path):
    skill = tmp_path / "skill.md"
    skill.write_text('# Skill\n\n<file path="a.txt">\nan example\n</file>\n\n## Rules\n- Be exact.\n')
    db = f"sqlite:///{tmp_path / 'md.db'}"
    call("run", "--set", f"initial_skill={skill}", "--set", "num_epochs=1", "--db", db, "--run-id", "m", "-q")
    summary = json.loads(call("show", "m", "--json", "--db", db))
    diff = call("diff", "m", "0", str(summary["steps"]), "--db", db)
    assert "+++ m@step_" in diff and "a.txt" not in diff.split("\n", 2)[1]
