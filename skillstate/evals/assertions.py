"""The deterministic graders of an eval's typed assertions (`skillstate.evals.spec` reads and checks
them): `grade` scores an output against an item's assertions, the deterministic ones here and now;
`llm-rubric` and the item's natural-language expectations are left for a judge and `command` for a
workspace. `not-` negates a check: it passes when the plain one fails, and its score is one minus the
plain one's.

A python check runs the author's function in this process: `fn(output, item)` returns a bool, a
score in [0, 1] (passed when it reaches `threshold`, default 0.5), or a dict with `pass`, `score`
and `reason`. Whatever it raises or returns that is none of those is a failed assertion with the
reason, never an error of the caller.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from jsonschema import exceptions as schema_exceptions  # type: ignore[import-untyped]
from jsonschema import validators as schema_validators
from pydantic import BaseModel, ConfigDict

from skillstate.errors import clip
from skillstate.evals.spec import ANY_ALL, ONE_TEXT, Assertion, PythonTarget, json_kind

if TYPE_CHECKING:
    from skillstate.evals.read import EvalItem

DEFAULT_THRESHOLD = 0.5  # a python check's score passes at or above it unless the assertion sets one
REASON_CHARS = 300  # a reason is cut to about this many characters
_FENCED = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)

Status = Literal["passed", "failed", "needs_judge", "needs_workspace"]


class AssertionResult(BaseModel):
    """An assertion's verdict. `score` is in [0, 1] (1 or 0 for a yes/no check; a python check
    may give a partial score); both `passed` and `score` are None until a judge or a workspace
    grades a pending one."""

    model_config = ConfigDict(frozen=True)

    index: int  # its position in the item's `assertions`
    type: str  # as written, `not-` included
    weight: float
    status: Status
    score: float | None = None
    reason: str = ""
    metric: str | None = None

    @property
    def passed(self) -> bool | None:
        if self.status == "passed":
            return True
        if self.status == "failed":
            return False
        return None

    @property
    def pending(self) -> bool:
        return self.status in ("needs_judge", "needs_workspace")


class Graded(BaseModel):
    """An output graded against one item. `soft` is the weighted share of the graded assertions
    that passed, `hard` whether all of them passed; an assertion of weight 0 is reported and counts
    in neither. Both are None when nothing counted was graded (no assertions, or only pending ones).
    `expectations` are the item's natural-language statements, left for the judge."""

    model_config = ConfigDict(frozen=True)

    item_id: str
    results: tuple[AssertionResult, ...]
    expectations: tuple[str, ...] = ()
    soft: float | None = None
    hard: bool | None = None

    @property
    def pending(self) -> tuple[AssertionResult, ...]:
        """The assertions left for a judge or a workspace."""
        return tuple(r for r in self.results if r.pending)

    def with_results(self, extra: Sequence[AssertionResult]) -> Graded:
        """The grading with `extra` verdicts (a judge's, a workspace's) in place of the pending
        assertions at the same index, or added after them; the scores recomputed."""
        by_index = {r.index: r for r in extra}
        merged = [by_index.pop(r.index, r) for r in self.results] + sorted(by_index.values(), key=lambda r: r.index)
        return _graded(self.item_id, merged, self.expectations)



# --- grading ------------------------------------------------------------------------------------------


Verdict = tuple[bool, float, str]  # (passed, score, reason) of the plain (not negated) check


def _cut(text: str, limit: int = 60) -> str:
    return repr(clip(text, limit))


def _contains(output: str, needle: str, fold: bool) -> Verdict:
    hay, pin = (output.casefold(), needle.casefold()) if fold else (output, needle)
    at = hay.find(pin)
    if at >= 0:
        return True, 1.0, f"found {_cut(needle)} at character {at}"
    return False, 0.0, f"{_cut(needle)} not found in the output ({len(output):,} characters)"


def _any_all(kind: str, output: str, needles: list[str]) -> Verdict:
    fold = kind.startswith("i")
    found = [n for n in needles if _contains(output, n, fold)[0]]
    missing = [n for n in needles if n not in found]
    if kind.endswith("-any"):
        if found:
            return True, 1.0, f"found {_cut(found[0])}"
        return False, 0.0, f"none of the {len(needles)} values found"
    if not missing:
        return True, 1.0, f"found all {len(needles)} values"
    return False, 0.0, f"{len(missing)} of {len(needles)} not found, first {_cut(missing[0])}"


def parse_json_output(output: str) -> Any:
    """The JSON value the output is: its whole text, or one fenced code block that is the whole
    text. `ValueError` says why it is not JSON (NaN and Infinity are not JSON)."""
    text = output.strip()
    fenced = _FENCED.match(text)
    if fenced:
        text = fenced.group(1).strip()

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as err:
        raise ValueError(f"{err.msg} (line {err.lineno}, column {err.colno})") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality that tells true from 1 (Python's == does not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _equals(output: str, expected: Any) -> Verdict:
    if isinstance(expected, str):
        got, want = output.strip(), expected.strip()
        if got == want:
            return True, 1.0, "the output equals the value"
        at = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), min(len(got), len(want)))
        return False, 0.0, (f"differs at character {at}: expected {_cut(want[at:at + 40])}, "
                            f"got {_cut(got[at:at + 40])}")
    try:
        doc = parse_json_output(output)
    except ValueError as err:
        return False, 0.0, f"the output is not JSON ({err}), so it cannot equal {_cut(json.dumps(expected))}"
    if _same_json(doc, expected):
        return True, 1.0, "the output's JSON equals the value"
    return False, 0.0, f"the output's JSON {_cut(json.dumps(doc))} differs from {_cut(json.dumps(expected))}"


def _regex(output: str, pattern: str) -> Verdict:
    match = re.search(pattern, output)
    if match:
        return True, 1.0, f"matched {_cut(match.group(0))} at character {match.start()}"
    return False, 0.0, f"no match for /{clip(pattern, 60)}/"


def _json(output: str, schema: Any) -> Verdict:
    try:
        doc = parse_json_output(output)
    except ValueError as err:
        return False, 0.0, f"the output is not JSON: {err}"
    if schema is None:
        return True, 1.0, f"the output is JSON ({json_kind(doc)})"
    validator = schema_validators.validator_for(schema)(schema)
    error = schema_exceptions.best_match(validator.iter_errors(doc))
    if error is None:
        return True, 1.0, "the output's JSON matches the schema"
    return False, 0.0, f"does not match the schema at {error.json_path}: {clip(error.message, 200)}"


# --- python checks -------------------------------------------------------------------------------------

_MODULES: dict[tuple[Any, ...], ModuleType] = {}


def load_check(target: PythonTarget) -> Callable[..., Any]:
    """The function a python assertion names; a file is loaded again when it changes. Raises what
    the import raises, or `AttributeError`/`TypeError` when the name is missing or not callable."""
    if target.file is not None:
        stat = target.file.stat()
        key: tuple[Any, ...] = ("file", str(target.file), stat.st_mtime_ns, stat.st_size)
        module = _MODULES.get(key)
        if module is None:
            module = _load_file(target.file)
            _MODULES[key] = module
    else:
        assert target.module is not None
        module = importlib.import_module(target.module)
    fn = getattr(module, target.function, None)
    if fn is None:
        raise AttributeError(f"{target.file or target.module} has no function {target.function!r}")
    if not callable(fn):
        raise TypeError(f"{target.function!r} in {target.file or target.module} is not a function")
    return fn


def _load_file(path: Path) -> ModuleType:
    name = "skillstate_eval_check_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so that dataclasses and pickling inside it find their module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _score_value(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    score = float(value)
    return score if math.isfinite(score) and 0 <= score <= 1 else None


def _python(assertion: Assertion, output: str, item: EvalItem) -> Verdict:
    target = assertion.python
    assert target is not None
    threshold = DEFAULT_THRESHOLD if assertion.threshold is None else assertion.threshold
    try:
        fn = load_check(target)
    except (Exception, SystemExit) as err:
        return False, 0.0, f"cannot load {target}: {type(err).__name__}: {err}"
    try:
        got = fn(output, item)
    except (Exception, SystemExit) as err:
        return False, 0.0, f"{target} raised {type(err).__name__}: {err}"
    return python_result(got, threshold)


def python_result(got: Any, threshold: float = DEFAULT_THRESHOLD) -> Verdict:
    """What a python check's return value means: a bool, a score in [0, 1] (passed at or above
    `threshold`), or a dict with `pass` (or `pass_`), `score` and `reason`."""
    shape = "return True/False, a score between 0 and 1, or a dict with pass, score and reason"
    if isinstance(got, bool):
        return got, float(got), f"returned {got}"
    if isinstance(got, (int, float)):
        score = _score_value(got)
        if score is None:
            return False, 0.0, f"returned {got!r}, not a score between 0 and 1"
        return score >= threshold, score, f"returned {score:g} (passes at {threshold:g})"
    if isinstance(got, dict):
        flag = got.get("pass", got.get("pass_"))
        if flag is not None and not isinstance(flag, bool):
            return False, 0.0, f"returned pass={flag!r}, not true or false"
        score = _score_value(got["score"]) if got.get("score") is not None else None
        if got.get("score") is not None and score is None:
            return False, 0.0, f"returned score={got['score']!r}, not a score between 0 and 1"
        if flag is None and score is None:
            return False, 0.0, f"returned a dict without pass or score; {shape}"
        reason = got.get("reason")
        reason = reason if isinstance(reason, str) and reason.strip() else ""
        passed = flag if flag is not None else (score is not None and score >= threshold)
        score = score if score is not None else float(passed)
        return passed, score, reason or f"returned pass={passed}, score={score:g}"
    return False, 0.0, f"returned {type(got).__name__}; {shape}"


# --- an item -------------------------------------------------------------------------------------------


def check(assertion: Assertion, output: str, item: EvalItem) -> Verdict:
    """The plain verdict of one deterministic assertion (its `not-` ignored)."""
    kind, value = assertion.type, assertion.value
    if kind == "equals":
        return _equals(output, value)
    if kind in ONE_TEXT:
        if kind == "starts-with":
            ok = output.startswith(value)
            return ok, float(ok), ("the output starts with it" if ok else f"the output starts with "
                                                                          f"{_cut(output[:len(value) + 10])}")
        return _contains(output, value, fold=kind == "icontains")
    if kind in ANY_ALL:
        return _any_all(kind, output, value)
    if kind == "regex":
        return _regex(output, value)
    if kind in ("is-json", "json-schema"):
        return _json(output, value)
    if kind == "python":
        return _python(assertion, output, item)
    raise ValueError(f"{assertion.name} is not graded here (it needs a {assertion.needs})")


def grade_assertion(index: int, assertion: Assertion, output: str, item: EvalItem) -> AssertionResult:
    """One assertion's result: graded when it is deterministic, pending when it needs a judge or a
    workspace. Never raises for what the output or a python check does."""
    def result(status: Status, score: float | None, reason: str) -> AssertionResult:
        return AssertionResult(index=index, type=assertion.name, weight=assertion.weight, status=status,
                               score=score, reason=clip(reason, REASON_CHARS), metric=assertion.metric)

    if assertion.needs == "judge":
        return result("needs_judge", None, "needs a judge")
    if assertion.needs == "workspace":
        return result("needs_workspace", None, "needs a workspace")
    passed, score, reason = check(assertion, output, item)
    if assertion.negate:
        passed, score = not passed, 1.0 - score
    return result("passed" if passed else "failed", score, reason)


def scores(results: Sequence[AssertionResult]) -> tuple[float | None, bool | None]:
    """(soft, hard) of some results: the weighted share passed and whether all passed, over the
    graded ones of positive weight; (None, None) when there are none."""
    counted = [r for r in results if r.passed is not None and r.weight > 0]
    if not counted:
        return None, None
    total = math.fsum(r.weight for r in counted)
    soft = math.fsum(r.weight for r in counted if r.passed) / total
    hard = all(r.passed for r in counted)
    return (1.0 if hard else min(soft, 1.0)), hard


def _graded(item_id: str, results: Sequence[AssertionResult], expectations: Sequence[str]) -> Graded:
    soft, hard = scores(results)
    return Graded(item_id=item_id, results=tuple(results), expectations=tuple(expectations), soft=soft, hard=hard)


def grade(output: str, item: EvalItem) -> Graded:
    """The output graded against `item`'s assertions (the deterministic ones; the others pending),
    with its expectations listed for the judge."""
    results = [grade_assertion(n, a, output, item) for n, a in enumerate(item.assertions)]
    return _graded(item.id, results, item.expectations)
