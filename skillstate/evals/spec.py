"""An eval's typed assertions as written: the names of the types, the validated `Assertion` (and the
`PythonTarget` a `python` one calls), and `parse_assertion`, which checks one as the evals are read.

An assertion is an object in an eval's `assertions` list, in the shape promptfoo's `assert` entries
have: `type`, `value`, an optional `weight` (default 1), `threshold` (for scored types) and `metric`
(a label). `not-` before any type negates it. `parse_assertion` raises `AssertionSpecError` with
what is wrong (an unknown type, a regex that does not compile, a JSON Schema that is not one, a python
target not in `module:function` form); the reader adds the file and the item. Grading is in
`skillstate.evals.assertions`.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path
from typing import Any, Literal

from jsonschema import exceptions as schema_exceptions  # type: ignore[import-untyped]
from jsonschema import validators as schema_validators
from pydantic import BaseModel, ConfigDict

from skillstate.errors import clip
from skillstate.input_files import read_input_text
from skillstate.skilltree.paths import path_problem

NEGATION = "not-"

# Types with one non-empty string value, and with a list of them.
ONE_TEXT = ("contains", "icontains", "starts-with")
ANY_ALL = ("contains-any", "contains-all", "icontains-any", "icontains-all")
LOCAL_TYPES = ("equals", *ONE_TEXT, *ANY_ALL, "regex", "is-json", "json-schema", "python")
JUDGE_TYPES = ("llm-rubric",)  # graded by an LLM judge, with the item's expectations
WORKSPACE_TYPES = ("command",)  # graded by running a command in the task's workspace
KNOWN_TYPES = (*LOCAL_TYPES, *JUDGE_TYPES, *WORKSPACE_TYPES)
_SCORED_TYPES = ("python", "llm-rubric")  # the types whose `threshold` means something
ASSERTION_KEYS = ("type", "value", "weight", "threshold", "metric")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

class AssertionSpecError(ValueError):
    """One assertion is malformed; the message says what is wrong, the reader says where."""


class PythonTarget(BaseModel):
    """The function a `python` assertion calls: `module:function` (an importable module) or
    `path.py:function` (a file, resolved inside the directory the evals were read from)."""

    model_config = ConfigDict(frozen=True)

    function: str
    module: str | None = None
    file: Path | None = None
    written: str  # as the eval file gives it, for messages

    def __str__(self) -> str:
        return self.written


class Assertion(BaseModel):
    """One validated assertion. `type` is the plain type (`contains`), `negate` says whether it was
    written with `not-`. `value` is as written, except that a JSON Schema given as `file://...` is
    the schema the file holds."""

    model_config = ConfigDict(frozen=True)

    type: str
    negate: bool = False
    value: Any = None
    weight: float = 1.0
    threshold: float | None = None
    metric: str | None = None
    python: PythonTarget | None = None

    @property
    def name(self) -> str:
        """The type as written: `not-contains`."""
        return NEGATION + self.type if self.negate else self.type

    @property
    def needs(self) -> Literal["judge", "workspace"] | None:
        """What grades it when it is not graded here."""
        if self.type in JUDGE_TYPES:
            return "judge"
        if self.type in WORKSPACE_TYPES:
            return "workspace"
        return None



# --- parsing -----------------------------------------------------------------------------------------


def json_kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _number(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AssertionSpecError(f"{key} must be a number, not {json_kind(value)}")
    return float(value)


def parse_assertion(raw: Any, base: Path) -> Assertion:
    """One assertion object validated; `base` is the directory that file paths in it (a python
    check's file, a JSON Schema's file) are relative to. `AssertionSpecError` says what is wrong."""
    if not isinstance(raw, dict):
        raise AssertionSpecError(f"an assertion is an object with a type, not {json_kind(raw)}")
    unknown = sorted(set(raw) - set(ASSERTION_KEYS), key=str)
    if unknown:
        raise AssertionSpecError(f"unknown key {unknown[0]!r} (an assertion takes {', '.join(ASSERTION_KEYS)})")
    written = raw.get("type")
    if not isinstance(written, str) or not written.strip():
        raise AssertionSpecError("missing type" if written is None
                                 else f"type must be a non-empty string, not {json_kind(written)}")
    negate = written.startswith(NEGATION)
    kind = written[len(NEGATION):] if negate else written
    if kind not in KNOWN_TYPES:
        raise AssertionSpecError(_unknown_type(written))
    weight = _number(raw, "weight")
    if weight is not None and weight < 0:
        raise AssertionSpecError(f"weight must be 0 or more, not {weight:g}")
    threshold = _number(raw, "threshold")
    if threshold is not None:
        if kind not in _SCORED_TYPES:
            raise AssertionSpecError(f"threshold has no meaning for {written} (only for {', '.join(_SCORED_TYPES)})")
        if not 0 <= threshold <= 1:
            raise AssertionSpecError(f"threshold must be between 0 and 1, not {threshold:g}")
    metric = raw.get("metric")
    if metric is not None and (not isinstance(metric, str) or not metric.strip()):
        raise AssertionSpecError(f"metric must be a non-empty string, not {json_kind(metric)}")
    value, python = _value(kind, raw, base)
    return Assertion(type=kind, negate=negate, value=value, weight=1.0 if weight is None else weight,
                     threshold=threshold, metric=metric, python=python)


def _unknown_type(written: str) -> str:
    names = [*KNOWN_TYPES, *(NEGATION + t for t in KNOWN_TYPES)]
    close = difflib.get_close_matches(written, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(KNOWN_TYPES)}, and not-<type>)"
    return f"unknown assertion type {written!r}{hint}"


def _value(kind: str, raw: dict[str, Any], base: Path) -> tuple[Any, PythonTarget | None]:
    value = raw.get("value")
    if kind == "equals":
        if "value" not in raw:
            raise AssertionSpecError("equals needs a value (the text, or a JSON value, the output must equal)")
        return value, None
    if kind in (*ONE_TEXT, "llm-rubric"):
        return _text(kind, value), None
    if kind in ANY_ALL:
        if not isinstance(value, list) or not value:
            raise AssertionSpecError(f"{kind} needs a value that is a non-empty list of strings, "
                                     f"not {json_kind(value)}")
        return [_text(f"{kind} value[{n}]", v) for n, v in enumerate(value)], None
    if kind == "regex":
        pattern = _text(kind, value)
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as err:
            raise AssertionSpecError(f"regex {clip(pattern, 80)!r} does not compile: {err}") from None
        return pattern, None
    if kind == "is-json":
        return (None if value is None else _schema(kind, value, base)), None
    if kind == "json-schema":
        if value is None:
            raise AssertionSpecError("json-schema needs a value: a JSON Schema (an object) or file://<path> of one")
        return _schema(kind, value, base), None
    if kind == "python":
        return value, _python_target(value, base)
    if kind == "command":
        if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            return list(value), None
        if isinstance(value, str) and value.strip():
            return value, None
        raise AssertionSpecError("command needs a value: a shell command (a string) or its arguments (a list of "
                                 f"strings), not {json_kind(value)}")
    raise AssertionSpecError(f"unknown assertion type {kind!r}")  # pragma: no cover (KNOWN_TYPES is checked first)


def _text(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise AssertionSpecError(f"{what} needs a value that is a string, not {json_kind(value)}")
    if not value:
        raise AssertionSpecError(f"{what} needs a non-empty value")
    return value


def resolve_inside(base: Path, written: str) -> Path:
    """The regular file that `written` (a relative path, `./` allowed) names inside `base`;
    `ValueError` says what is wrong: an unsafe path, one that leads out through a symlink, one that
    does not exist or is not a regular file."""
    rel = written.removeprefix("./")
    problem = path_problem(rel)
    if problem is not None:
        raise ValueError(f"is refused: {problem}")
    try:
        root, resolved = base.resolve(), (base / rel).resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise ValueError(f"cannot be resolved: {err}") from None
    if root not in resolved.parents:
        raise ValueError(f"leads outside {base} (through a symlink)")
    if not resolved.exists():
        raise ValueError(f"does not exist in {base}")
    if not resolved.is_file():
        raise ValueError("is not a regular file" + ("; list the files in it" if resolved.is_dir() else ""))
    return resolved


def _inside(base: Path, written: str, what: str) -> Path:
    try:
        return resolve_inside(base, written)
    except ValueError as err:
        raise AssertionSpecError(f"{what} {written!r} {err}") from None


def _schema(kind: str, value: Any, base: Path) -> Any:
    if isinstance(value, str) and value.startswith("file://"):
        path = _inside(base, value[len("file://"):], "the schema file")
        try:
            value = json.loads(read_input_text(path, encoding="utf-8-sig"))
        except (OSError, UnicodeDecodeError) as err:
            raise AssertionSpecError(f"cannot read the schema file {path}: {err}") from None
        except (json.JSONDecodeError, RecursionError) as err:
            raise AssertionSpecError(f"the schema file {path} is not valid JSON: {err}") from None
    if not isinstance(value, (dict, bool)):
        raise AssertionSpecError(f"{kind} needs a JSON Schema (an object) or file://<path> of one, "
                                 f"not {json_kind(value)}")
    try:
        schema_validators.validator_for(value).check_schema(value)
    except schema_exceptions.SchemaError as err:
        where = "/".join(str(p) for p in err.path)
        raise AssertionSpecError(f"{kind}: not a valid JSON Schema{f' at {where}' if where else ''}: "
                                 f"{clip(err.message, 200)}") from None
    return value


def _python_target(value: Any, base: Path) -> PythonTarget:
    form = "module:function or path/to/file.py:function"
    if not isinstance(value, str) or not value.strip():
        raise AssertionSpecError(f"python needs a value of the form {form}, not {json_kind(value)}")
    text = value.strip()
    spec = text[len("file://"):] if text.startswith("file://") else text
    where, sep, function = spec.rpartition(":")
    if not sep or not where or not _IDENT.match(function):
        raise AssertionSpecError(f"python value {clip(text, 80)!r} is not of the form {form}")
    if where.endswith(".py"):
        return PythonTarget(function=function, file=_inside(base, where, "the python file"), written=text)
    if text.startswith("file://") or not _MODULE.match(where):
        raise AssertionSpecError(f"python value {clip(text, 80)!r} is not of the form {form}")
    return PythonTarget(function=function, module=where, written=text)
