"""Training an Agent Skills directory (issue 23, its first part): the run
trains the directory's SKILL.md with its front matter protected, records
the directory once in RunStarted, replays and audits like any run, and
exports a directory or an archive that installs as is. A markdown skill's
run records exactly what it did before."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import EXAMPLES, Crash, assert_paid_once, crashing_factory, small_config
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import call
from test_inputs_config import refused

from skillstate.engine.runner import lineage_events
from skillstate.engine.update import patch_skill
from skillstate.log.event_codec import encode
from skillstate.log.events import RunStarted
from skillstate.log.values import Edit
from skillstate.reading.audit import audit, verify
from skillstate.skillopt.guidance import body_of, front_of, protect, with_guidance
from skillstate.skilltree import load_skill, validate_skill
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import canonical_json

SKILL_DIR = EXAMPLES / "skills" / "short-answers"
FRONT = "---\nname: demo\ndescription: Answer questions. Use for any question.\n---\n"

line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
edit = st.builds(Edit, op=st.sampled_from(["append", "insert_after", "replace", "delete"]),
                 target=st.one_of(line, st.sampled_from(["name: demo", "---", "# Rules", "- Be brief."])),
                 content=st.one_of(line, st.sampled_from(["---", "name: other", "description: x"])))


@given(st.lists(edit, max_size=6), st.sampled_from(["", "- Be brief.\n", "# Rules\n- Be brief.\n"]),
       st.booleans())
@settings(max_examples=300, deadline=None)
def test_no_edit_can_touch_the_front_matter(edits, body, final_newline):
    front = FRONT if final_newline or body else FRONT.rstrip("\n")  # a file that ends with its front matter
    text, _report, _restored = patch_skill(front + body, edits)
    assert front_of(text).rstrip("\n") == front.rstrip("\n")  # the name and the description an agent reads
    assert front_of(text) == front or not body_of(text) == ""  # a newline is added only when a body follows


@given(line, line)
@settings(max_examples=200, deadline=None)
def test_a_rewrite_gets_the_base_front_matter_back(rewritten, guidance):
    base = with_guidance(FRONT + "- Be brief.\n", guidance or None)
    fixed, _ = protect(base, rewritten)
    assert fixed.startswith(FRONT) and body_of(fixed).rstrip("\n") == body_of(rewritten).rstrip("\n")


def test_a_markdown_skill_that_opens_with_a_rule_line_keeps_it_in_its_body():
    text = "---\n# Not a front matter\n- but markdown\n---\nmore\n"
    assert front_of(text) == "" and body_of(text) == text
    assert front_of("---\n\n---\nmore\n") == ""  # two rule lines: no mapping between them


def test_a_rewrite_that_repeats_a_broken_front_matter_gets_the_base_one_instead():
    base = FRONT + "- Be brief.\n"
    fixed, restored = protect(base, "---\nname: [demo\n---\n- Be brief.\n- Check units.\n")
    assert restored and fixed == FRONT + "- Be brief.\n- Check units.\n"


def test_runs_logged_before_the_protection_read_it_off():
    from skillstate.log.event_codec import decode

    started = {"config": {}, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f", "prompts": {},
               "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    assert decode("RunStarted", 7, started).config["protect_front_matter"] is False
    forked = {"parent_run_id": "p", "fork_step": 1, "parent_event_count": 3, "parent_event_hash": "x",
              "overrides": {}, "config": {}, "prompts": {}, "steps_per_epoch": 1, "total_steps": 1}
    assert decode("RunForked", 6, forked).config["protect_front_matter"] is False
    assert small_config().protect_front_matter  # new runs protect it
    # with it off, a front matter is text like any other (as those runs edited it)
    text, _, _ = patch_skill(FRONT, [Edit(op="replace", target="name: demo", content="name: other")], False)
    assert "name: other" in text


@pytest.fixture(scope="module")
def dir_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("skilldir")
    store = Store(f"sqlite:///{tmp / 'runs.db'}")
    Trainer(small_config(num_epochs=1, initial_skill=str(SKILL_DIR)), store=store, run_id="d").train()
    return tmp, store


def test_a_skill_directory_trains_its_skill_md_and_keeps_its_front_matter(dir_run):
    tmp, store = dir_run
    events = lineage_events(store, "d")
    started = events[0].event
    assert isinstance(started, RunStarted) and started.skill_tree is not None
    assert started.skill_tree in started.blob_refs() and set(started.skill_tree_blobs) <= set(started.blob_refs())
    initial = (SKILL_DIR / "SKILL.md").read_text(encoding="utf-8")
    assert store.get_blob(started.initial_skill) == initial
    best = call("export", "d", "--db", store.url)
    assert best != initial and front_of(best) == front_of(initial)
    assert "name: short-answers" not in body_of(best)
    assert "the Agent Skills directory short-answers (2 files;" in call("show", "d", "--db", store.url)
    out = call("why", "d", "digits only", "--db", store.url, code=2)  # a reference's text, not the trained file's
    assert "but in references/answer-forms.md, which the run keeps as read" in out
    tree = json.loads(call("show", "d", "--json", "--db", store.url))["skill_tree"]
    assert [f["path"] for f in tree["files"]] == ["SKILL.md", "references/answer-forms.md"]
    assert "--- d@step_0/SKILL.md" in call("diff", "d", "0", "3", "--db", store.url)
    assert audit(store, "d").ok
    report = verify(store, "d")
    assert report.ok and report.checked == report.total


def _events(store: Store, run_id: str) -> list[str]:
    return [canonical_json([s.type, encode(s.event)]) for s in lineage_events(store, run_id)]


def test_a_directory_run_killed_mid_way_resumes_to_the_same_events(tmp_path, dir_run):
    _, whole = dir_run
    store = Store(f"sqlite:///{tmp_path / 'crash.db'}")
    config = small_config(num_epochs=1, initial_skill=str(SKILL_DIR))
    with pytest.raises(Crash):  # past the baseline and the work done ahead, inside the first steps
        Trainer(config, store=store, run_id="d", backend_factory=crashing_factory(200)).train()
    assert 1 < len(lineage_events(store, "d")) < len(lineage_events(whole, "d"))
    Trainer(config, store=store, run_id="d").train()
    assert _events(store, "d") == _events(whole, "d")
    assert_paid_once(store, "d")


def test_a_fork_of_a_directory_run_pays_nothing_again_and_exports_its_directory(tmp_path, dir_run):
    _, store = dir_run
    config = small_config(num_epochs=1, initial_skill=str(SKILL_DIR))
    Trainer(config, store=store, run_id="d").fork(step=2, overrides={"lr_scheduler": "linear"},
                                                   new_run_id="f2").train()
    parent = {c.request_hash for c in store.read_calls("d")}
    assert not parent & {c.request_hash for c in store.read_calls("f2")}  # what the parent paid for is served
    assert audit(store, "f2").ok and verify(store, "f2").ok
    call("export", "f2", "--into", str(tmp_path / "forked"), "--db", store.url)
    assert (tmp_path / "forked" / "short-answers" / "references" / "answer-forms.md").read_bytes() == (
        SKILL_DIR / "references" / "answer-forms.md").read_bytes()


def test_the_trained_skill_exports_as_a_directory_and_an_archive_that_install(dir_run):
    tmp, store = dir_run
    out = call("export", "d", "--into", str(tmp / "skills"), "--db", store.url)
    assert f"wrote {tmp / 'skills' / 'short-answers'}: the Agent Skill short-answers" in out
    installed = tmp / "skills" / "short-answers"
    for ref in (SKILL_DIR / "references").iterdir():  # what the run did not train is byte for byte the same
        assert (installed / "references" / ref.name).read_bytes() == ref.read_bytes()
    wrote = call("export", "d", "-o", str(tmp / "trained.md"), "--db", store.url)
    assert wrote.startswith(f"wrote {tmp / 'trained.md'}: ")
    trained = (tmp / "trained.md").read_text(encoding="utf-8")
    assert (installed / "SKILL.md").read_text(encoding="utf-8") == trained
    call("export", "d", "-o", str(tmp / "s.skill"), "--db", store.url)
    packed = load_skill(tmp / "s.skill")
    assert validate_skill(packed.tree, packed.dir_name).ok
    assert packed.tree == load_skill(installed).tree
    call("export", "d", "--into", str(tmp / "skills"), "--db", store.url, code=2)  # exists: not replaced
    call("export", "d", "--into", str(tmp / "skills"), "--force", "--db", store.url)


def test_a_markdown_run_records_no_tree_and_cannot_be_installed(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'md.db'}")
    Trainer(small_config(num_epochs=1), store=store, run_id="m").train()
    payload = json.loads(call("log", "m", "--json", "--db", store.url))[0]
    assert "skill_tree" not in json.dumps(payload)
    out = call("export", "m", "--into", str(tmp_path / "skills"), "--db", store.url, code=2)
    assert "no front matter" in out and not (tmp_path / "skills").exists()


def test_an_invalid_skill_directory_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "wrong-name"
    shutil.copytree(SKILL_DIR, bad)
    refused(tmp_path / "r.db", "run", "--set", f"initial_skill={bad}", match="wrong-name")
    # its SKILL.md given alone is the same directory, refused the same way (not trained as a lone file)
    refused(tmp_path / "r.db", "run", "--set", f"initial_skill={bad / 'SKILL.md'}", match="wrong-name")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "r.db", "run", "--set", f"initial_skill={tmp_path / 'empty'}", match="SKILL.md is missing")


def test_what_the_check_warns_about_is_shown_when_the_run_starts(tmp_path):
    linked = tmp_path / "short-answers"
    shutil.copytree(SKILL_DIR, linked)
    with open(linked / "SKILL.md", "a", encoding="utf-8") as fh:
        fh.write("See [the guide](references/missing.md).\n")
    db = f"sqlite:///{tmp_path / 'w.db'}"
    out = call("run", "--epochs", "1", "-q", "--set", f"initial_skill={linked}", "--db", db)
    assert "warning: skill: SKILL.md: links to references/missing.md, which the skill does not hold" in out


def test_a_skill_holding_a_secret_is_refused_and_nothing_of_it_is_stored(tmp_path, monkeypatch):
    leaky = tmp_path / "short-answers"
    shutil.copytree(SKILL_DIR, leaky)
    (leaky / ".env").write_text("TOKEN=abc\n", encoding="utf-8")
    refused(tmp_path / "r.db", "run", "--set", f"initial_skill={leaky}", match=".env holds or looks like a secret")
    (leaky / ".env").unlink()
    key = "sk-test-0123456789abcdefghij"
    with open(leaky / "references" / "answer-forms.md", "a", encoding="utf-8") as fh:
        fh.write(f"Use the key {key}.\n")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    line = refused(tmp_path / "r.db", "run", "--set", f"initial_skill={leaky}", match="references/answer-forms.md")
    assert key not in line


def test_export_to_a_place_it_cannot_write_is_one_line(dir_run, tmp_path):
    _, store = dir_run
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    out = call("export", "d", "--into", str(tmp_path / "afile" / "sub"), "--db", store.url, code=2)
    assert "cannot write" in out and "Traceback" not in out


def test_a_skill_archive_trains_like_its_directory(tmp_path):
    call("skill", "pack", str(SKILL_DIR), str(tmp_path / "s.skill"))
    runs = {}
    for name, source in (("dir", SKILL_DIR), ("zip", tmp_path / "s.skill")):
        store = Store(f"sqlite:///{tmp_path / f'{name}.db'}")
        Trainer(small_config(num_epochs=1, initial_skill=str(source)), store=store, run_id="a").train()
        runs[name] = [e.event for e in lineage_events(store, "a")[1:]]
    assert runs["dir"] == runs["zip"]


def test_eval_scores_a_skill_directory(tmp_path):
    db = f"sqlite:///{tmp_path / 'e.db'}"
    call("eval", "--skill", str(SKILL_DIR), "--run-id", "e", "--db", db)
    started = lineage_events(Store(db), "e")[0].event
    assert started.kind == "eval" and started.skill_tree is not None
    assert Store(db).get_blob(started.initial_skill) == (SKILL_DIR / "SKILL.md").read_text(encoding="utf-8")


def test_run_started_v7_reads_as_a_run_of_a_markdown_skill():
    from skillstate.log.event_codec import decode

    payload = {"config": {}, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f", "prompts": {},
               "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    up = decode("RunStarted", 7, payload)
    assert up.skill_tree is None and up.skill_tree_blobs == [] and up.blob_refs() == ["h"]


def test_the_dashboard_lists_the_directory_files_with_their_text_escaped(tmp_path):
    from starlette.testclient import TestClient

    from skillstate.dashboard.app import create_app
    from skillstate.dashboard.store_view import open_read_only

    hostile = tmp_path / "short-answers"
    shutil.copytree(SKILL_DIR, hostile)
    (hostile / "references" / "x.md").write_text("<script>window.__pwned = 1</script>\n", encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    store = Store(url)
    Trainer(small_config(num_epochs=1, initial_skill=str(hostile)), store=store, run_id="h").train()
    store.close()
    view = open_read_only(url)
    with TestClient(create_app(view, allowed_hosts=["testserver"])) as client:
        html = client.get("/runs/h/skill").text
    view.close()
    assert "Files of the skill directory" in html and "references/answer-forms.md" in html
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html and "<script>window.__pwned" not in html
