"""The judge of env evals, as pure functions, and the environment's rollout with a judge handed in: reading
its verdicts, the majority of samples, agreement, and what a failing or unreadable judge leaves (never a
pass)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skillstate.envs.skill_evals import EvalsEnv, stored_item
from skillstate.errors import DataError
from skillstate.evals.judge import Statement, Verdict, agreement, majority, read_verdicts, statements_of
from skillstate.evals.read import EvalFile, EvalItem
from skillstate.evals.spec import parse_assertion
from skillstate.llm.base import CallResult
from skillstate.log.values import CallRef
from skillstate.prompts import resolve_prompts
from skillstate.sim.evals_world import judge_reply

PROMPTS = resolve_prompts({})


def _verdicts(*passed: bool) -> str:
    return json.dumps({"verdicts": [{"index": n, "passed": p, "evidence": f"e{n}"} for n, p in enumerate(passed, 1)]})


def test_verdicts_are_read_in_statement_order_from_plain_or_fenced_json():
    reply = json.dumps({"verdicts": [{"index": 2, "passed": False, "evidence": "no"},
                                     {"index": 1, "passed": True, "evidence": "yes"}]})
    for text in (reply, f"```json\n{reply}\n```", f"Here you are: {reply} Done."):
        got = read_verdicts(text, 2)
        assert [(v.index, v.passed, v.evidence) for v in got] == [(1, True, "yes"), (2, False, "no")]


@pytest.mark.parametrize(("text", "problem"), [
    ("I think it passes", "not JSON"),
    ('{"verdicts": [{"index": 1, "passed": "maybe"}]}', "wrong shape"),
    ('{"verdicts": [{"index": 1, "passed": true}]}', "no verdict for statement 2"),
    ('{"verdicts": [{"index": 1, "passed": true}, {"index": 1, "passed": false}]}', "twice"),
    ('{"grades": []}', "wrong shape"),
])
def test_a_reply_that_is_not_a_verdict_for_every_statement_is_an_error_never_a_grade(text, problem):
    got = read_verdicts(text, 2)
    assert isinstance(got, str) and problem in got


def test_evidence_is_cut_to_a_bounded_length():
    long = "x" * 5000
    got = read_verdicts(json.dumps({"verdicts": [{"index": 1, "passed": True, "evidence": long}]}), 1)
    assert isinstance(got, list) and len(got[0].evidence) < 400


@given(st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=7))
def test_a_statement_passes_only_when_more_than_half_the_samples_pass_it(samples):
    statements = [Statement(kind="expectation", text=f"s{n}", index=n) for n in range(3)]
    decided = majority(statements, [[Verdict(index=n + 1, passed=p) for n, p in enumerate(s)] for s in samples])
    for n, d in enumerate(decided):
        votes = [s[n] for s in samples]
        assert d.passed == (sum(votes) * 2 > len(votes))  # a tie fails
        assert d.votes == tuple(votes)
    rate = agreement(decided)
    assert rate is None if len(samples) == 1 else rate == sum(len(set(d.votes)) == 1 for d in decided) / 3


def test_a_negated_rubric_passes_when_the_judge_finds_it_unmet():
    item = EvalItem(id="1", prompt="p", assertions=(parse_assertion({"type": "not-llm-rubric", "value": "rude"}, "."),))
    statements = statements_of(item.expectations, item.assertions)
    assert [(s.kind, s.text, s.negate) for s in statements] == [("llm-rubric", "rude", True)]
    assert majority(statements, [[Verdict(index=1, passed=False)]])[0].passed is True


def _call(text: str = "", error: str | None = None, role: str = "target") -> CallResult:
    return CallResult(ref=CallRef(request_hash=str(hash((text, error, role))), role=role), text=text, error=error)


def _env(samples: int = 1, **item) -> tuple[EvalsEnv, dict]:
    raw = {"id": "e1", "prompt": "Write the notes", "expectations": ["Has a summary.", "Names owners."],
           "assertions": [{"type": "icontains", "value": "action items"}], **item}
    assertions = [parse_assertion(a, ".").model_dump(mode="json") for a in raw["assertions"]]
    stored = {**raw, "files": [], "assertions": assertions,
              "expected_output": raw.get("expected_output", ""), "task_type": ""}
    env = EvalsEnv({"train": [stored], "val": [], "test": []})
    env.judge_samples = samples
    return env, stored


def test_an_output_is_graded_by_its_assertions_and_the_judges_majority():
    env, item = _env(samples=3)
    replies = iter([_verdicts(True, False), _verdicts(True, True), _verdicts(True, False)])
    sent: list[tuple[list, int | None]] = []

    def judge(messages, seed):
        sent.append((messages, seed))
        return _call(next(replies), role="judge")

    out = env.rollout("skill", item, lambda m, t=None: _call("Action items: none"), PROMPTS, judge=judge)
    assert [seed for _, seed in sent] == [0, 1, 2]  # each sample its own request
    checks = out.trajectory["grading"]["checks"]
    assert [(c["kind"], c["passed"]) for c in checks] == [("assertion", True), ("expectation", True),
                                                         ("expectation", False)]
    assert out.hard == 0.0 and out.soft == pytest.approx(2 / 3)
    assert out.fail_reason.startswith("failed 1 of 3 checks: Names owners.")
    assert len(out.calls) == 3 and out.call is not None
    assert out.trajectory["grading"]["agreement"] == pytest.approx(1 / 2)
    user = sent[0][0][-1]["content"]  # the judge sees the task and the output, never the skill
    assert "Write the notes" in user and "Action items: none" in user and "skill" not in user.split("<task>")[0]


@pytest.mark.parametrize("reply", [None, "not json at all"])
def test_a_judge_that_fails_or_cannot_be_read_fails_the_item_as_an_error(reply):
    env, item = _env()

    def judge(messages, seed):
        return _call(reply, role="judge") if reply is not None else _call(error="HTTP 500", role="judge")

    out = env.rollout("skill", item, lambda m, t=None: _call("Action items"), PROMPTS, judge=judge)
    assert (out.hard, out.soft) == (0.0, 0.0)
    assert out.fail_reason.startswith("rollout_error: judge: ")  # counted by the failure policy like any call
    assert out.trajectory["grading"]["judge_error"]


def test_an_item_with_only_an_expected_output_is_judged_against_it():
    env, item = _env(expectations=[], assertions=[], expected_output="A list of names")
    seen = []

    def judge(messages, seed):
        seen.append(messages[-1]["content"])
        return _call(_verdicts(True), role="judge")

    out = env.rollout("skill", item, lambda m, t=None: _call("Ada"), PROMPTS, judge=judge)
    assert out.hard == 1.0 and "A list of names" in seen[0]


def test_input_files_are_inlined_before_the_prompt(tmp_path):
    (tmp_path / "notes.txt").write_text("Ana: hello\n")
    item = EvalItem(id="3", prompt="Summarise the attached", expectations=("x",),
                    files=(EvalFile(name="notes.txt", path=tmp_path / "notes.txt"),))
    stored = stored_item(item)
    assert stored["files"] == [{"name": "notes.txt", "text": "Ana: hello\n"}]
    env = EvalsEnv({"train": [stored], "val": [], "test": []})
    text = env.user_message(stored, PROMPTS)
    assert text.index("Ana: hello") < text.index("Summarise the attached") and 'name="notes.txt"' in text


def test_what_env_evals_cannot_grade_is_refused_when_the_evals_are_read(tmp_path):
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00binary")
    binary = EvalItem(id="b", prompt="p", expectations=("x",),
                      files=(EvalFile(name="bin.dat", path=tmp_path / "bin.dat"),))
    command = EvalItem(id="c", prompt="p", assertions=(parse_assertion({"type": "command", "value": "pytest"}, "."),))
    empty = EvalItem(id="n", prompt="p")
    for item, problem in ((binary, "not UTF-8"), (command, "workspace"), (empty, "nothing to grade")):
        with pytest.raises(DataError, match=problem):
            stored_item(item)


def test_the_sim_judge_finds_statements_in_the_output_and_errs_at_its_rate_deterministically():
    env, item = _env()
    from skillstate.evals.judge import judge_messages

    statements = statements_of(["Has a summary.", "Names owners."], [])
    messages = judge_messages(PROMPTS, "task", "- Has a summary.\nsomething else", statements)
    exact = json.loads(judge_reply(messages, None, 0.0))["verdicts"]
    assert [v["passed"] for v in exact] == [True, False]
    assert judge_reply(messages, 3, 0.4) == judge_reply(messages, 3, 0.4)  # a function of the request
    flips = sum(json.loads(judge_reply(messages, s, 0.3))["verdicts"][0]["passed"] is False for s in range(200))
    assert 30 < flips < 90  # about 30 % of the verdicts wrong


def test_the_engine_knows_which_built_in_environments_grade_with_a_judge_without_importing_them():
    from skillstate.engine.loading import UNJUDGED_BUILTINS, judged
    from skillstate.envs.registry import BUILTIN, resolve_env

    assert set(UNJUDGED_BUILTINS) | {"evals"} == set(BUILTIN)
    assert all(judged(name) == bool(getattr(resolve_env(name), "uses_judge", False)) for name in BUILTIN)
