"""A skill's own evals as a task (env `evals`): the target answers each eval's prompt with the skill as its
system prompt (its input files inlined before the prompt), and the output is graded: the typed
assertions here (`skillstate.evals.assertions`), the expectations and `llm-rubric` assertions by the
run's judge, a third LLM role whose every call is journaled. An item's soft score is the weighted share
of its checks passed, its hard score whether all passed.

The items come from the skill directory's `evals/evals.json`, split by the run's seed (see
`skillstate.engine.create`), or from a data directory of items in the same shape. The log keeps each
item as this module stores it (`stored_item`): input files as their text, assertions as validated, so
resume, fork and verify never read the skill directory again (a `python` assertion's function excepted:
it is the author's code, imported where the evals named it).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skillstate.envs.base import Complete, JudgeCall, RolloutOutcome, SkillEnv
from skillstate.errors import DataError
from skillstate.evals.assertions import grade_assertion
from skillstate.evals.judge import Decided, agreement, judge_messages, majority, read_verdicts, statements_of
from skillstate.evals.read import EvalFile, EvalItem
from skillstate.evals.spec import Assertion
from skillstate.input_files import read_input_text
from skillstate.llm.base import CallResult
from skillstate.prompts import render

DEFAULT_SKILL = """# Skill

Do what the user asks, completely and exactly.
"""
MAX_FILE_CHARS = 200_000  # an input file is inlined in the prompt: larger is refused when the evals are read
EXPECTED_STATEMENT = "The output does what this describes: {}"


class InputFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    text: str


class EvalTask(BaseModel):
    """An eval as the run's log holds it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    prompt: str
    expected_output: str = ""
    files: list[InputFile] = Field(default_factory=list)
    expectations: list[str] = Field(default_factory=list)
    assertions: list[dict[str, Any]] = Field(default_factory=list)  # `Assertion`s, dumped
    task_type: str = ""
    trigger: bool | None = None  # a trigger eval (disclosure: tools): should the target use the skill for it?
    expected_skill: str | None = None  # the skill it should load ("" for none); unset: the trained one

    @field_validator("id", mode="before")
    @classmethod
    def _id_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v


class EvalsConfig(BaseModel):
    """`env_config` of env evals."""

    model_config = ConfigDict(extra="forbid")

    split: tuple[int, int, int] | tuple[float, float, float] = Field(
        (0.6, 0.2, 0.2), description="How a skill's evals are split into train, val and test: three shares that "
                                     "add up to 1, or three counts.")


def stored_item(item: EvalItem) -> dict[str, Any]:
    """An eval read from its file, as the log keeps it: input files inlined (text only), assertions
    validated. A DataError names a file that cannot be inlined."""
    files = []
    for f in item.files:
        try:
            text = read_input_text(f.path)
        except UnicodeDecodeError:
            raise DataError(f"eval {item.id!r}: input file {f.name} is not UTF-8 text (env evals inlines input "
                            "files in the prompt)") from None
        except OSError as err:
            raise DataError(f"eval {item.id!r}: cannot read input file {f.name}: "
                            f"{getattr(err, 'strerror', None) or err}") from None
        if len(text) > MAX_FILE_CHARS:
            raise DataError(f"eval {item.id!r}: input file {f.name} has {len(text):,} characters, more than the "
                            f"{MAX_FILE_CHARS:,} inlined in a prompt")
        files.append({"name": f.name, "text": text})
    command = next((a for a in item.assertions if a.type == "command"), None)
    if command is not None:
        raise DataError(f"eval {item.id!r}: a command assertion runs in a workspace task (env workspace), not in "
                        "env evals")
    if not item.expectations and not item.assertions and not item.expected_output.strip():
        raise DataError(f"eval {item.id!r} has nothing to grade: give it expectations, assertions or an "
                        "expected_output")
    task = EvalTask(id=item.id, prompt=item.prompt, expected_output=item.expected_output,
                    files=[InputFile(**f) for f in files], expectations=list(item.expectations),
                    assertions=[a.model_dump(mode="json") for a in item.assertions])
    return task.model_dump(exclude_none=True)


def eval_item(item: dict[str, Any]) -> EvalItem:
    """A stored item as the graders take it."""
    return EvalItem(id=item["id"], prompt=item["prompt"], expected_output=item.get("expected_output", ""),
                    files=tuple(EvalFile(name=f["name"], path=Path(f["name"])) for f in item.get("files", [])),
                    expectations=tuple(item.get("expectations", [])),
                    assertions=tuple(Assertion.model_validate(a) for a in item.get("assertions", [])))


def check_label(assertion: Assertion) -> str:
    """How an assertion is named to the analysts and in reports."""
    if assertion.metric:
        return assertion.metric
    value = assertion.value
    if assertion.type == "python" and assertion.python is not None:
        return f"{assertion.name} {assertion.python}"
    if value is None or isinstance(value, (dict, list)) and assertion.type == "json-schema":
        return assertion.name
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f"{assertion.name} {shown[:120]!r}" if isinstance(value, str) else f"{assertion.name} {shown[:120]}"


def trigger_item(n: int, query: str, should_trigger: bool) -> dict[str, Any]:
    """A trigger eval as the log keeps it: its query is the task, and what counts is whether the target loads
    the trained skill for it (`disclosure: tools`)."""
    task = EvalTask(id=f"trigger-{n}", prompt=query, trigger=should_trigger,
                    expected_skill=None if should_trigger else "")
    return task.model_dump(exclude_none=True)


def trigger_outcome(item: dict[str, Any], used: bool, loaded: list[str], answer: str,
                    messages: list[dict[str, Any]]) -> RolloutOutcome:
    """A trigger eval's outcome: passed when the target loaded the trained skill (`used`; `loaded` is every
    skill it loaded) exactly when the eval says it should."""
    check = {"kind": "trigger", "text": "uses the skill" if item["trigger"] else "does not use the skill",
             "weight": 1.0, "passed": used == item["trigger"], "votes": [],
             "evidence": f"loaded: {', '.join(loaded) or 'no skill'}"}
    score = 1.0 if check["passed"] else 0.0
    return RolloutOutcome(score, score, "" if score else f"failed 1 of 1 checks: {check['text']}", answer, messages,
                          item.get("task_type", ""), trajectory={"messages": messages, "grading": {"checks": [check]}})


class EvalsEnv(SkillEnv):
    kind = "evals"
    item_model = EvalTask
    config_model = EvalsConfig
    uses_judge = True  # the executor hands `rollout` a judge
    plays_disclosure = True  # with disclosure tools, its own loop offers load_skill and read_skill_file
    installation: Any = None  # disclosure tools: the installed skills (set by envs.disclosure.disclosed)
    max_calls = 8

    @classmethod
    def load_splits(cls, path: str | Path, splits: list[str]) -> dict[str, list[dict[str, Any]]]:
        from skillstate.evals.read import read_eval_data_dir

        read = read_eval_data_dir(path, splits)
        return {name: [stored_item(item) for item in read[name]] for name in splits}

    def default_skill(self) -> str:
        return DEFAULT_SKILL

    def user_message(self, item: dict[str, Any], prompts: dict[str, str]) -> str:
        block = "".join(f'<file name="{f["name"]}">\n{f["text"]}\n</file>\n\n' for f in item.get("files", []))
        return render(prompts["evals_user"], files_block=block, prompt=item["prompt"]).strip() + "\n"

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str],
                judge: JudgeCall | None = None) -> RolloutOutcome:
        task_type = item.get("task_type", "")
        if self.installation is not None and skill:  # disclosure tools: the target sees the installed skills
            return self._disclosed(skill, item, complete, prompts, judge)
        # no skill (a run's score without one) is no system message at all, not an empty one
        messages = [{"role": "system", "content": skill}] if skill else []
        messages.append({"role": "user", "content": self.user_message(item, prompts)})
        result = complete(messages)
        if not result.ok:
            return RolloutOutcome(0.0, 0.0, f"rollout_error: {result.error}", "", messages, task_type, result)
        convo = messages + [{"role": "assistant", "content": result.text}]
        if item.get("trigger") is not None:  # (no skill installed: a run's score without one)
            return replace(trigger_outcome(item, False, [], result.text, convo), call=result)
        outcome = self.grade(item, result.text, convo, prompts, judge, truncated=result.truncated)
        return replace(outcome, call=result)

    def _disclosed(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str],
                   judge: JudgeCall | None) -> RolloutOutcome:
        from skillstate.envs.disclosure import SkillReader, answer_with_skills

        reader = SkillReader(self.installation, skill)
        messages: list[dict[str, Any]] = [{"role": "system", "content": reader.system_prompt(prompts)},
                                          {"role": "user", "content": self.user_message(item, prompts)}]
        answer, reason, calls = answer_with_skills(reader, messages, complete, self.max_calls)
        seen = {"installed": reader.installed(), "skills_loaded": reader.loaded, "files_read": reader.read}
        if item.get("trigger") is not None:  # a trigger eval: only whether the target used the skill counts
            outcome = trigger_outcome(item, reader.trained.name in reader.loaded, reader.loaded, answer or "",
                                      messages)
            outcome = replace(outcome, trajectory={**(outcome.trajectory or {}), **seen})
        elif answer is None:
            outcome = RolloutOutcome(0.0, 0.0, reason, "", messages, item.get("task_type", ""),
                                     trajectory={"messages": messages, **seen})
        else:
            outcome = self.grade(item, answer, messages, prompts, judge, truncated=calls[-1].truncated)
            outcome = replace(outcome, trajectory={**(outcome.trajectory or {}), **seen})
        return replace(outcome, calls=calls + outcome.calls, turns=len(calls), skills_loaded=list(reader.loaded),
                       files_read=list(reader.read))

    def grade(self, item: dict[str, Any], output: str, convo: list[dict[str, Any]], prompts: dict[str, str],
              judge: JudgeCall | None, truncated: bool = False) -> RolloutOutcome:
        """The outcome of `output` graded against the item's checks: the assertions here, the rest by `judge`
        (its calls in `calls`)."""
        task_type = item.get("task_type", "")
        graded = eval_item(item)
        checks = [_checked(graded.assertions[r.index], r) for r in
                  (grade_assertion(n, a, output, graded) for n, a in enumerate(graded.assertions))
                  if r.status != "needs_judge"]
        statements = statements_of(graded.expectations, graded.assertions)
        if not statements and not checks and graded.expected_output.strip():
            statements = statements_of([EXPECTED_STATEMENT.format(graded.expected_output.strip())], [])
        calls: list[CallResult] = []
        decided: list[Decided] = []
        if statements:
            if judge is None:
                raise RuntimeError("env evals grades expectations with a judge, and none was given")
            samples = []
            for seed in self._seeds():
                call = judge(judge_messages(prompts, item["prompt"], output, statements), seed)
                calls.append(call)
                read = read_verdicts(call.text, len(statements)) if call.ok else f"judge call failed: {call.error}"
                if isinstance(read, str):
                    record = {"messages": convo, "grading": {"checks": checks, "judge_error": read}}
                    return RolloutOutcome(0.0, 0.0, f"rollout_error: judge: {read}", output, convo, task_type,
                                          calls=calls, trajectory=record)
                samples.append(read)
            decided = majority(statements, samples)
        checks += [{"kind": d.statement.kind, "text": d.statement.text, "weight": d.statement.weight,
                    "passed": d.passed, "evidence": d.evidence, "votes": list(d.votes)} for d in decided]
        counted = [c for c in checks if c["weight"] > 0 and c["passed"] is not None]
        total = sum(c["weight"] for c in counted)
        soft = sum(c["weight"] for c in counted if c["passed"]) / total if total else 0.0
        hard = 1.0 if counted and all(c["passed"] for c in counted) else 0.0
        failed = [c for c in checks if c["passed"] is False and c["weight"] > 0]
        reason = "" if hard else (f"failed {len(failed)} of {len(counted)} checks: {failed[0]['text'][:200]}"
                                  if failed else "nothing graded")
        if truncated and reason:
            reason += " (reply truncated at max_tokens)"
        record = {"messages": convo, "grading": {"checks": checks, "agreement": agreement(decided),
                                                 "judge_calls": len(calls)}}
        return RolloutOutcome(hard, min(soft, 1.0) if not hard else 1.0, reason, output, convo, task_type,
                              calls=calls, trajectory=record)

    def _seeds(self) -> list[int | None]:
        samples = getattr(self, "judge_samples", 1)
        return [None] if samples == 1 else list(range(samples))

    def describe_item(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"id": item["id"], "task_type": item.get("task_type", ""), "task": item["prompt"]}

    def reflection_view(self, trajectory: Any) -> dict[str, Any]:
        """The conversation without the skill, and each check with its verdict and evidence (the analysts see
        train items only; the judge's prompt never); with disclosure tools, which skills the target loaded."""
        view = super().reflection_view(trajectory)
        grading = trajectory.get("grading", {}) if isinstance(trajectory, dict) else {}
        if isinstance(trajectory, dict) and "skills_loaded" in trajectory:
            view.update(installed_skills=trajectory.get("installed", []),
                        skills_loaded=trajectory["skills_loaded"], files_read=trajectory.get("files_read", []))
        view["checks"] = [{"check": c["text"], "passed": c["passed"], "evidence": c.get("evidence", "")}
                          for c in grading.get("checks", [])]
        return view


def _checked(assertion: Assertion, result: Any) -> dict[str, Any]:
    """A deterministic assertion's result as the trajectory records it."""
    kind = "command" if result.status == "needs_workspace" else "assertion"
    return {"kind": kind, "text": check_label(assertion), "weight": result.weight, "passed": result.passed,
            "evidence": result.reason, "votes": []}
