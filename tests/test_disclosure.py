"""Progressive disclosure (issue 23, §3): with `disclosure: tools` the target
sees the installed skills by name and description, loads a skill and its
files through tools, and the optimizer may edit the trained skill's
description (`describe`). The run records which skills and files each
rollout loaded, reports trigger recall and precision, and replays, resumes
and forks like any run."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, Crash, assert_paid_once, crashing_factory, small_config
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import call
from test_inputs_config import refused

from skillstate.engine.runner import lineage_events
from skillstate.engine.update import patch_skill
from skillstate.envs.disclosure import LOAD_SKILL, READ_FILE, Installation, catalogue, installed_skill, run_tool
from skillstate.log.event_codec import encode
from skillstate.log.events import BaselineEvaluated, RunStarted
from skillstate.log.values import DroppedEdit, Edit
from skillstate.reading.audit import audit, verify
from skillstate.reading.triggers import trigger_rates
from skillstate.sim.disclosure import catalogue_of, to_load, to_read
from skillstate.skillopt.describe import apply_describe, description_of
from skillstate.skillopt.guidance import body_of, front_of
from skillstate.skillopt.screen import screen_edits
from skillstate.skilltree import SkillFile, SkillTree, parse_front_matter, validate_skill, with_skill_md
from skillstate.skilltree.bundle import view_files
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import canonical_json

SKILLS = EXAMPLES / "skills"
TRAINED = SKILLS / "exact-answers"
DISTRACTORS = [SKILLS / "distractors" / "number-words", SKILLS / "distractors" / "calendar-notes"]
FRONT = "---\nname: demo\ndescription: Answer questions.\nlicense: MIT\n---\n"


def disclosure_config(**kw):
    return small_config(**{"initial_skill": str(TRAINED), "disclosure": "tools",
                           "distractor_skills": [str(p) for p in DISTRACTORS], **kw})


def tree(files: dict[str, str]) -> SkillTree:
    return SkillTree({path: SkillFile.of_text(text) for path, text in files.items()})


# --- the describe edit -----------------------------------------------------------------------

description = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=80)


@given(description)
@settings(max_examples=300, deadline=None)
def test_a_describe_edit_sets_only_the_description_and_keeps_the_skill_valid(text):
    new, status = apply_describe(FRONT, text)
    fields = parse_front_matter(new).fields
    assert fields["name"] == "demo" and fields["license"] == "MIT"  # nothing else moves
    if status == "applied":
        assert fields["description"] == text.strip()
        assert validate_skill(with_skill_md(tree({"SKILL.md": "x"}), new + "body\n"), "demo").ok
    else:
        assert new == FRONT and status in ("skipped_invalid", "unchanged")


line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
any_edit = st.builds(Edit, op=st.sampled_from(["append", "insert_after", "replace", "delete", "describe"]),
                     target=st.one_of(line, st.sampled_from(["name: demo", "---", "# Rules", "- Be brief."])),
                     content=st.one_of(line, description, st.sampled_from(["---", "name: other", "a\nb"])))


@given(st.lists(any_edit, max_size=8))
@settings(max_examples=300, deadline=None)
def test_any_sequence_of_edits_leaves_a_valid_skill_with_its_name(edits):
    base = FRONT + "# Rules\n- Be brief.\n"
    text, report, _ = patch_skill(base, edits, True, describe=True)
    assert len(report) == len(edits) and [r.index for r in report] == list(range(len(edits)))
    skill = with_skill_md(tree({"SKILL.md": base, "references/a.md": "x\n"}), text)
    assert validate_skill(skill, "demo").ok
    fields = parse_front_matter(text).fields
    assert fields["name"] == "demo" and fields["license"] == "MIT"


def test_describe_edits_apply_only_where_the_run_takes_them():
    base = FRONT + "# Rules\n- Be brief.\n"
    edits = [Edit(op="append", content="- Check units."),
             Edit(op="describe", content="Answer arithmetic and unit conversion questions."),
             Edit(op="describe", content="two\nlines")]
    text, report, _ = patch_skill(base, edits, True, describe=True)
    assert description_of(front_of(text)) == "Answer arithmetic and unit conversion questions."
    assert body_of(text).endswith("- Check units.")
    assert [(r.index, r.op, r.status) for r in report] == [
        (0, "append", "appended"), (1, "describe", "applied"), (2, "describe", "skipped_invalid")]
    old, old_report, _ = patch_skill(base, edits, True)  # a run without disclosure: an unknown op, as before
    assert front_of(old) == FRONT and [r.status for r in old_report][1:] == ["skipped_unknown_op"] * 2


def test_screening_drops_describe_edits_that_cannot_apply():
    edits = [Edit(op="describe", content="Answer questions."), Edit(op="describe", content=""),
             Edit(op="describe", content="x" * 1025), Edit(op="describe", content="Answer any question.")]
    kept, dropped = screen_edits("- Be brief.\n", "", edits, front=FRONT)
    assert kept == [3] and [d.reason for d in dropped] == ["no_change", "invalid_description", "invalid_description"]
    assert screen_edits("- Be brief.\n", "", edits[3:], front="")[1][0].reason == "no_front_matter"
    assert screen_edits("- Be brief.\n", "", edits[3:])[1][0].reason == "unknown_op"  # not taken by this run
    two = [Edit(op="describe", content="Answer sums."), Edit(op="append", content="- x"),
           Edit(op="describe", content="Answer dates.")]  # each sets the whole description: the first is kept
    assert screen_edits("- Be brief.\n", "", two, front=FRONT) == ([0, 1], [DroppedEdit(index=2,
                                                                                           reason="another_describe")])


# --- the installed skills and their tools ----------------------------------------------------

def _installation() -> Installation:
    trained = tree({"SKILL.md": FRONT + "See references/a.md.\n", "references/a.md": "rule A\n"})
    other = installed_skill(tree({"SKILL.md": "---\nname: other\ndescription: Other things.\n---\nbody\n"}))
    return Installation(trained, (other,))


def test_the_catalogue_lists_every_installed_skill_by_name_and_description_only():
    skills = _installation().skills(FRONT.replace("Answer questions.", "Answer sums.") + "secret body\n")
    text = catalogue(skills)
    assert catalogue_of(text) == {"demo": "Answer sums.", "other": "Other things."}
    assert "secret body" not in text and "rule A" not in text


def test_the_skill_tools_load_a_body_read_a_file_and_refuse_in_one_line():
    skills = _installation().skills(FRONT + "See references/a.md.\n")
    out, loaded, read = run_tool(skills, LOAD_SKILL, json.dumps({"name": "demo"}))
    assert loaded == "demo" and read is None and "See references/a.md." in out and "references/a.md" in out
    out, loaded, read = run_tool(skills, READ_FILE, json.dumps({"skill": "demo", "path": "./references/a.md"}))
    assert (out, loaded, read) == ("rule A\n", None, "demo/references/a.md")
    for name, args, says in ((LOAD_SKILL, {"name": "nope"}, "no skill named 'nope'"),
                             (READ_FILE, {"skill": "demo", "path": "../x"}, "has no file '../x'"),
                             (READ_FILE, {"skill": "other", "path": "SKILL.md"}, None),
                             ("run_shell", {}, "there is no tool")):
        out, _, _ = run_tool(skills, name, json.dumps(args))
        assert (says is None and not out.startswith("error")) or (says and out.startswith("error") and says in out)
    assert run_tool(skills, LOAD_SKILL, "{not json")[0].startswith("error: the arguments are not valid JSON")
    for hostile in ("[" * 5000 + "]" * 5000, '{"name": ' + "9" * 5000 + "}", '{"name": "' + "x" * 20_000 + '"}'):
        assert run_tool(skills, LOAD_SKILL, hostile)[0].startswith("error: the arguments")  # never a crash
    out, loaded, _ = run_tool(skills, READ_FILE, json.dumps({"skill": "demo", "path": "SKILL.md"}))
    assert loaded == "demo" and "See references/a.md." in out  # reading SKILL.md is loading the skill


def test_a_tool_environment_survives_arguments_json_cannot_read():
    from skillstate.envs.tools import ToolEnv

    env = ToolEnv({"train": [{"id": "a"}]})
    assert env._run({"id": "a"}, {"t"}, "t", "[" * 5000 + "]" * 5000)[0].startswith("error: the arguments")


def test_a_skill_given_once_is_not_given_again_in_a_rollout():
    from skillstate.envs.disclosure import DisclosureEnv
    from skillstate.envs.qa import QAEnv
    from skillstate.llm.base import CallRef, CallResult, ToolCall

    env = DisclosureEnv(QAEnv({"test": [{"id": "q", "question": "2+2?", "answers": ["4"]}]}), _installation(), 4)
    replies = iter([(ToolCall("c1", LOAD_SKILL, '{"name": "demo"}'), ToolCall("c2", LOAD_SKILL, '{"name": "demo"}')),
                    (ToolCall("c3", READ_FILE, '{"skill": "demo", "path": "references/a.md"}'),), ()])

    def complete(messages, tools=None):
        return CallResult(CallRef(request_hash="h", role="target"), text="" if (calls := next(replies)) else "4",
                          tool_calls=calls)

    from skillstate.prompts import resolve_prompts

    out = env.rollout(FRONT + "See references/a.md.\n", env.item("q"), complete, resolve_prompts({}))
    tool_outputs = [m["content"] for m in out.trajectory["messages"] if m["role"] == "tool"]
    assert tool_outputs[1] == "demo is already loaded above." and tool_outputs[2] == "rule A\n"
    assert out.skills_loaded == ["demo"] and out.files_read == ["demo/references/a.md"] and out.hard == 1.0


def test_the_sim_target_loads_the_best_matching_skills_and_reads_what_they_point_to():
    listed = {"a": "Arithmetic calculation help.", "b": "Any calculation.", "c": "Dates."}
    assert to_load(listed, "arithmetic") == ["a"]
    assert to_load({"b": "Any calculation.", "d": "Arithmetic."}, "arithmetic") == ["b", "d"]  # a tie loads both
    assert to_load(listed, "reading") == []
    body = "- Reading a passage: see [r](references/reading.md).\n- Lists: references/lists.md\n"
    assert to_read(body, "reading") == ["references/reading.md"]
    assert to_read(body + "Always read references/all.md.\n", "arithmetic") == ["references/all.md"]


def test_trigger_rates_count_recall_over_rollouts_and_precision_over_loads():
    results = [{"item_id": "1", "task_type": "x", "skills_loaded": ["t"], "files_read": ["t/r.md"]},
               {"item_id": "2", "task_type": "x", "skills_loaded": ["t", "d"]},
               {"item_id": "3", "task_type": "y", "skills_loaded": ["d"]},
               {"item_id": "4", "task_type": "y"},
               {"item_id": "5", "task_type": "y", "skills_loaded": ["t"]}]
    items = {"5": {"id": "5", "expected_skill": ""}}  # an item no skill is for
    rates = trigger_rates(results, items, "t")
    assert rates["recall"] == 2 / 4 and rates["precision"] == 2 / 5 and rates["wrong_loads"] == 3
    assert rates["by_task_type"] == {"x": 1.0, "y": 0.0} and rates["files_read"] == {"t/r.md": 1}
    assert trigger_rates([], {}, "t")["recall"] is None


# --- runs ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def disclosed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("disclosure")
    store = Store(f"sqlite:///{tmp / 'runs.db'}")
    Trainer(disclosure_config(num_epochs=1), store=store, run_id="p").train()
    return tmp, store


def test_a_disclosure_run_installs_the_skills_learns_when_to_load_and_replays(disclosed_run):
    _, store = disclosed_run
    events = lineage_events(store, "p")
    started = events[0].event
    assert isinstance(started, RunStarted) and len(started.distractors) == 2
    assert set(started.distractors) <= set(started.blob_refs())
    baseline = next(e.event for e in events if isinstance(e.event, BaselineEvaluated))
    results = json.loads(store.get_blob(baseline.results))
    loaded = {r["task_type"]: r.get("skills_loaded", []) for r in results}
    assert loaded["reading"] == ["exact-answers"] and loaded["arithmetic"] == ["number-words"]
    assert any("exact-answers/references/reading.md" in r.get("files_read", []) for r in results)
    summary = json.loads(call("show", "p", "--json", "--db", store.url))
    triggers = summary["triggers"]
    assert triggers["test_best"]["recall"] > triggers["test_baseline"]["recall"]
    assert triggers["test_best"]["precision"] > triggers["test_baseline"]["precision"]
    assert summary["best_score"] > summary["baseline_score"]
    best = view_files(call("export", "p", "--db", store.url))["SKILL.md"]  # the run trains every file
    assert description_of(front_of(best)) != description_of(front_of((TRAINED / "SKILL.md").read_text()))
    assert "skill triggers" in call("show", "p", "--db", store.url)
    files = [e["file"] for step in range(1, summary["steps"] + 1)
             for e in json.loads(call("show", "p", "--step", str(step), "--json", "--db", store.url))
             .get("selected", {}).get("edits", [])]
    assert "SKILL.md (description)" in files and "SKILL.md" in files
    assert any(f.startswith("references/") for f in files)  # edits of other files, and new references
    assert audit(store, "p").ok
    report = verify(store, "p")
    assert report.ok and report.checked == report.total


def _events(store: Store, run_id: str) -> list[str]:
    return [canonical_json([s.type, encode(s.event)]) for s in lineage_events(store, run_id)]


def test_a_disclosure_run_killed_mid_rollout_resumes_to_the_same_events(tmp_path, disclosed_run):
    _, whole = disclosed_run
    store = Store(f"sqlite:///{tmp_path / 'crash.db'}")
    config = disclosure_config(num_epochs=1)
    with pytest.raises(Crash):  # inside a rollout of several calls
        Trainer(config, store=store, run_id="p", backend_factory=crashing_factory(333)).train()
    assert 1 < len(lineage_events(store, "p")) < len(lineage_events(whole, "p"))
    Trainer(config, store=store, run_id="p").train()
    assert _events(store, "p") == _events(whole, "p")
    assert_paid_once(store, "p")


def test_a_fork_of_a_disclosure_run_pays_nothing_again(disclosed_run):
    _, store = disclosed_run
    Trainer(disclosure_config(num_epochs=1), store=store, run_id="p").fork(
        step=2, overrides={"lr_scheduler": "linear"}, new_run_id="pf").train()
    parent = {c.request_hash for c in store.read_calls("p")}
    assert not parent & {c.request_hash for c in store.read_calls("pf")}
    assert audit(store, "pf").ok and verify(store, "pf").ok
    refused_fork = call("fork", "p", "step_2", "--set", "disclosure=inline", "--db", store.url, code=2)
    assert "disclosure" in refused_fork
    unprotected = call("fork", "p", "step_2", "--set", "protect_front_matter=false", "--db", store.url, code=2)
    assert "needs protect_front_matter" in unprotected


@pytest.mark.parametrize("args, match", [
    (["--set", "disclosure=tools"], "initial_skill must be a skill directory"),
    (["--set", f"initial_skill={TRAINED}", "--set", f"distractor_skills=[{DISTRACTORS[0]}]"],
     "only with disclosure: tools"),
    (["--set", f"initial_skill={TRAINED}", "--set", "disclosure=tools", "--set", f"distractor_skills=[{TRAINED}]"],
     "the name 'exact-answers' is already installed"),
    (["--set", f"initial_skill={TRAINED}", "--set", "disclosure=tools", "--set", "distractor_skills=[/no/such]"],
     "distractor skill /no/such: no such file or directory"),
    (["--set", f"initial_skill={TRAINED}", "--set", "disclosure=tools", "--set", "env=sql"],
     "plays question-answering environments"),
    (["--set", f"initial_skill={TRAINED}", "--set", "disclosure=tools", "--set", "protect_front_matter=false"],
     "disclosure: tools needs protect_front_matter"),
])
def test_a_disclosure_config_that_cannot_install_is_refused_in_one_line(tmp_path, args, match):
    refused(tmp_path / "r.db", "run", *args, match=match)


def test_an_expected_skill_that_is_not_installed_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test"):
        rows = [{"id": f"{split}{i}", "question": f"What is {i}+1?", "answers": [str(i + 1)], "task_type": "arithmetic",
                 "expected_skill": "exact-answer" if split == "val" and i == 1 else "exact-answers"} for i in range(3)]
        (data / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    refused(tmp_path / "r.db", "run", "--data", str(data), "--set", f"initial_skill={TRAINED}", "--set",
            "disclosure=tools", match="item 'val1' of split 'val': expected_skill 'exact-answer' is not an installed")


def test_one_describe_per_candidate_even_without_the_no_op_screen():
    from skillstate.skillopt.screen import screen_describes

    edits = [Edit(op="append", content="- x"), Edit(op="describe", content="Answer sums."),
             Edit(op="describe", content="Answer dates."), Edit(op="describe", content="")]
    assert screen_describes(edits, FRONT) == ([0, 1], [DroppedEdit(index=2, reason="another_describe"),
                                                       DroppedEdit(index=3, reason="invalid_description")])


def test_one_distractor_path_alone_reads_as_a_list_of_one(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"initial_skill: {TRAINED}\ndisclosure: tools\ndistractor_skills: {DISTRACTORS[0]}\n"
                      "num_epochs: 1\n", encoding="utf-8")
    out = call("run", "--config", str(config), "--db", f"sqlite:///{tmp_path / 'o.db'}")
    assert "skill triggers" in out


def test_the_disclosure_example_config_runs_from_its_own_folder(tmp_path):
    out = call("run", "--config", str(SKILLS / "disclosure.yaml"), "--set", "num_epochs=1",
               "--db", f"sqlite:///{tmp_path / 'e.db'}")
    assert "skill triggers" in out and "best skill (test)" in out


def test_the_dashboard_shows_the_trigger_rates(disclosed_run):
    from starlette.testclient import TestClient

    from skillstate.dashboard.app import create_app
    from skillstate.dashboard.store_view import open_read_only

    _, store = disclosed_run
    view = open_read_only(store.url)
    with TestClient(create_app(view, allowed_hosts=["testserver"])) as client:
        html = client.get("/runs/p").text
    view.close()
    assert "Skill triggers" in html and "test_best (test)" in html and "exact-answers/references/reading.md" in html


def test_the_plot_draws_the_trigger_rates_beside_the_task_types(disclosed_run):
    pytest.importorskip("matplotlib")
    from skillstate.exports.plots import plot_runs

    _, store = disclosed_run
    fig = plot_runs(store, ["p"])
    labels = [t.get_text() for t in fig.axes[1].get_xticklabels()]
    assert labels[-2:] == ["trigger\nrecall\nn=60", "trigger\nprecision\nn=60"]
    assert "skill trigger rates" in fig.axes[1].get_title(loc="left")
