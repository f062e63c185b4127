"""Reading an Agent Skill's own evals, where its author keeps them.

A skill directory may hold `evals/evals.json`, as Anthropic's skill-creator writes it:
`{"skill_name": ..., "evals": [{"id", "prompt", "expected_output", "files", "expectations",
"assertions"}, ...]}` (a bare list of the items is read too). `files` are paths relative to the skill
directory, given to the task as its input files; `expectations` are statements a judge grades;
`assertions` are typed checks (`skillstate.evals.assertions`), or plain statements, which join the
expectations (skill-creator's own assertions are such statements).

Trigger evals (does the skill's description make an agent use it?) are a list of
`{"query", "should_trigger"}`, or `{"evals": [{"prompt", "should_trigger"}]}`, in one of
`TRIGGER_FILES`.

A data directory holds eval items of the same shape split already: `train`, `val` and `test`, each
`.jsonl` (one item a line) or `.json` (a list), with files relative to the directory.

Every problem is one `DataError` line naming the file, the item (its position and id) and what is
wrong; nothing is half read.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from skillstate.errors import DataError
from skillstate.evals.spec import Assertion, AssertionSpecError, json_kind, parse_assertion, resolve_inside
from skillstate.input_files import read_input_text, split_file

EVALS_FILE = "evals/evals.json"
# skill-creator leaves the trigger eval set's name to the author (its review page saves eval_set.json);
# these are the names read, the first first. Two of them in one skill is refused.
TRIGGER_FILES = ("evals/trigger_evals.json", "evals/trigger-evals.json", "evals/trigger_eval.json",
                 "evals/trigger-eval.json", "evals/eval_set.json")
DATA_SPLITS = ("train", "val", "test")


class EvalFile(BaseModel):
    """An input file of an eval: `name` as the eval file gives it (relative to the skill or data
    directory), `path` the regular file it resolves to, inside that directory."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: Path


class EvalItem(BaseModel):
    """One eval: a task prompt and what its output must satisfy."""

    model_config = ConfigDict(frozen=True)

    id: str
    prompt: str
    expected_output: str = ""
    files: tuple[EvalFile, ...] = ()
    expectations: tuple[str, ...] = ()  # natural-language statements, for a judge
    assertions: tuple[Assertion, ...] = ()  # typed checks


class TriggerEval(BaseModel):
    """A query, and whether the skill should be used for it."""

    model_config = ConfigDict(frozen=True)

    query: str
    should_trigger: bool


class SkillEvals(BaseModel):
    """What a skill directory holds: its evals and, when it has them, its trigger evals."""

    model_config = ConfigDict(frozen=True)

    skill_dir: Path
    path: Path  # its evals.json
    skill_name: str | None = None
    items: tuple[EvalItem, ...]
    trigger_path: Path | None = None
    triggers: tuple[TriggerEval, ...] = ()


# --- files ---------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return read_input_text(path, encoding="utf-8-sig")  # a BOM at the start is fine
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None


def _load_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    except RecursionError:
        raise DataError(f"{path}: values nested too deeply to read") from None


def _load_jsonl(path: Path) -> list[tuple[str, Any]]:
    text = _read_text(path)
    values: list[tuple[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append((f"line {n}", json.loads(line)))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: line {n} is not valid JSON ({err.msg})") from None
        except RecursionError:
            raise DataError(f"{path}: line {n} is nested too deeply to read") from None
    return values


def _entries(path: Path, data: Any, what: str) -> list[tuple[str, Any]]:
    """The items of an eval file, each with where it is: a list, or an object holding `evals`."""
    if isinstance(data, dict):
        if "evals" not in data:
            raise DataError(f"{path}: expected {what}: a list of items or an object with an \"evals\" list")
        data = data["evals"]
        if not isinstance(data, list):
            raise DataError(f"{path}: \"evals\" must be a list of items, not {json_kind(data)}")
    elif not isinstance(data, list):
        raise DataError(f"{path}: expected {what}: a list of items or an object with an \"evals\" list, "
                        f"not {json_kind(data)}")
    return [(f"item {n}", obj) for n, obj in enumerate(data, 1)]


# --- items ---------------------------------------------------------------------------------------------


class _Bad(Exception):
    """What is wrong with one item; the caller names the file and the item (with its id once known)."""

    def __init__(self, message: str, item_id: str | None = None):
        super().__init__(message)
        self.item_id = item_id


def _string(obj: dict[str, Any], key: str, required: bool) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise _Bad(f"missing {key}")
        return ""
    if not isinstance(value, str):
        raise _Bad(f"{key} must be a string, not {json_kind(value)}")
    if required and not value.strip():
        raise _Bad(f"{key} is empty")
    return value


def _strings(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(f"{key} must be a list, not {json_kind(value)}")
    return value


def _item_id(obj: dict[str, Any]) -> str:
    value = obj.get("id")
    if value is None:
        raise _Bad("missing id")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _Bad(f"id must be a number or a string, not {json_kind(value)}")
    text = str(value)
    if not text.strip():
        raise _Bad("id is empty")
    return text


def _input_file(base: Path, n: int, raw: Any) -> EvalFile:
    if not isinstance(raw, str):
        raise _Bad(f"files[{n}] must be a path (a string), not {json_kind(raw)}")
    try:
        path = resolve_inside(base, raw)
    except ValueError as err:
        raise _Bad(f"files[{n}] {raw!r} {err}") from None
    return EvalFile(name=unicodedata.normalize("NFC", raw.removeprefix("./")), path=path)


def _eval_item(obj: Any, base: Path) -> EvalItem:
    if not isinstance(obj, dict):
        raise _Bad(f"is {json_kind(obj)}, not an object")
    if "should_trigger" in obj:
        raise _Bad(f"has should_trigger: trigger evals go in their own file ({TRIGGER_FILES[0]})")
    item_id = _item_id(obj)
    try:
        if "assert" in obj and "assertions" in obj:
            raise _Bad("has both assert and assertions; keep one")
        prompt = _string(obj, "prompt", required=True)
        expected = _string(obj, "expected_output", required=False)
        files = [_input_file(base, n, raw) for n, raw in enumerate(_strings(obj, "files"))]
        expectations: list[str] = []
        for n, text in enumerate(_strings(obj, "expectations")):
            if not isinstance(text, str) or not text.strip():
                raise _Bad(f"expectations[{n}] must be a non-empty string, not {json_kind(text)}")
            expectations.append(text)
        key = "assert" if "assert" in obj else "assertions"
        assertions: list[Assertion] = []
        for n, raw in enumerate(_strings(obj, key)):
            if isinstance(raw, str):  # a statement, as skill-creator writes them: for the judge
                if not raw.strip():
                    raise _Bad(f"{key}[{n}] is an empty string")
                expectations.append(raw)
                continue
            try:
                assertions.append(parse_assertion(raw, base))
            except AssertionSpecError as err:
                raise _Bad(f"{key}[{n}]: {err}") from None
    except _Bad as err:
        raise _Bad(str(err), item_id) from None
    return EvalItem(id=item_id, prompt=prompt, expected_output=expected, files=tuple(files),
                    expectations=tuple(expectations), assertions=tuple(assertions))


def _items(path: Path, entries: Sequence[tuple[str, Any]], base: Path,
           seen: dict[str, str] | None = None) -> tuple[EvalItem, ...]:
    """The items of one file validated; `seen` (id -> the item and file that hold it) carries the
    ids of files read before, so that a duplicate across them is found too."""
    seen = {} if seen is None else seen
    items = []
    for where, obj in entries:
        try:
            item = _eval_item(obj, base)
        except _Bad as err:
            named = f"{where} (id {err.item_id})" if err.item_id is not None else where
            sep = " " if str(err).startswith("is ") else ": "
            raise DataError(f"{path}: {named}{sep}{err}") from None
        if item.id in seen:
            raise DataError(f"{path}: {where}: duplicate id {item.id!r} (also {seen[item.id]})")
        seen[item.id] = f"{where} of {path.name}"
        items.append(item)
    if not items:
        raise DataError(f"{path}: no evals")
    return tuple(items)


def read_evals_file(path: str | Path, base: str | Path) -> tuple[str | None, tuple[EvalItem, ...]]:
    """(skill_name, items) of an evals.json; `base` is the directory its file paths are relative to."""
    path, base = Path(path), Path(base)
    data = _load_json(path)
    skill_name = None
    if isinstance(data, dict):
        skill_name = data.get("skill_name")
        if skill_name is not None and not isinstance(skill_name, str):
            raise DataError(f"{path}: skill_name must be a string, not {json_kind(skill_name)}")
    return skill_name, _items(path, _entries(path, data, "evals"), base)


# --- trigger evals -------------------------------------------------------------------------------------


def read_trigger_evals(path: str | Path) -> tuple[TriggerEval, ...]:
    """The trigger evals of a file: `[{"query", "should_trigger"}]` or `{"evals": [{"prompt",
    "should_trigger"}]}` (`query` and `prompt` mean the same)."""
    path = Path(path)
    out: list[TriggerEval] = []
    seen: dict[str, str] = {}
    for where, obj in _entries(path, _load_json(path), "trigger evals"):
        if not isinstance(obj, dict):
            raise DataError(f"{path}: {where} is {json_kind(obj)}, not an object")
        if "query" in obj and "prompt" in obj:
            raise DataError(f"{path}: {where}: has both query and prompt; keep one")
        key = "prompt" if "prompt" in obj else "query"
        try:
            query = _string(obj, key, required=True)
        except _Bad as err:
            raise DataError(f"{path}: {where}: {'missing query' if key not in obj else err}") from None
        flag = obj.get("should_trigger")
        if not isinstance(flag, bool):
            problem = ("missing should_trigger" if flag is None
                       else f"should_trigger must be true or false, not {json_kind(flag)}")
            raise DataError(f"{path}: {where}: {problem}")
        if query in seen:
            raise DataError(f"{path}: {where}: the same query as {seen[query]}")
        seen[query] = where
        out.append(TriggerEval(query=query, should_trigger=flag))
    if not out:
        raise DataError(f"{path}: no trigger evals")
    return tuple(out)


def find_trigger_file(skill_dir: str | Path) -> Path | None:
    """The skill's trigger eval file, or None; two of `TRIGGER_FILES` is a `DataError`."""
    skill_dir = Path(skill_dir)
    found = [skill_dir / name for name in TRIGGER_FILES if (skill_dir / name).exists()]
    if len(found) > 1:
        raise DataError(f"{skill_dir}: both {found[0].relative_to(skill_dir).as_posix()} and "
                        f"{found[1].relative_to(skill_dir).as_posix()} hold trigger evals; keep one of them")
    return found[0] if found else None


# --- a skill directory, a data directory ---------------------------------------------------------------


def has_evals(skill_dir: str | Path) -> bool:
    """Whether a skill directory holds evals/evals.json."""
    return (Path(skill_dir) / EVALS_FILE).exists()


def read_skill_evals(skill_dir: str | Path) -> SkillEvals:
    """A skill directory's evals/evals.json, and its trigger evals when it has a file of them.
    The directory's SKILL.md stands for the directory."""
    skill_dir = Path(skill_dir).expanduser()
    if skill_dir.name == "SKILL.md" and skill_dir.is_file():
        skill_dir = skill_dir.parent
    if not skill_dir.is_dir():
        raise DataError(f"{skill_dir}: not a skill directory" if skill_dir.exists()
                        else f"skill directory {skill_dir} does not exist")
    path = skill_dir / EVALS_FILE
    if not path.exists():
        raise DataError(f"{skill_dir}: no {EVALS_FILE} (a skill's evals go there: "
                        '{"skill_name": ..., "evals": [{"id": 1, "prompt": ..., "expectations": [...]}]})')
    skill_name, items = read_evals_file(path, skill_dir)
    trigger_path = find_trigger_file(skill_dir)
    triggers = read_trigger_evals(trigger_path) if trigger_path else ()
    return SkillEvals(skill_dir=skill_dir, path=path, skill_name=skill_name, items=items,
                      trigger_path=trigger_path, triggers=triggers)


def read_eval_data_dir(path: str | Path, splits: Sequence[str] = DATA_SPLITS) -> dict[str, tuple[EvalItem, ...]]:
    """A data directory of eval items split already: <split>.jsonl or <split>.json for each split,
    file paths relative to the directory, ids unique across the splits."""
    base = Path(path).expanduser()
    if base.is_file():
        raise DataError(f"data path {base} is a file; expected a directory holding "
                        + ", ".join(f"{s}.jsonl" for s in splits))
    if not base.is_dir():
        raise DataError(f"data directory {base} does not exist")
    seen: dict[str, str] = {}
    out: dict[str, tuple[EvalItem, ...]] = {}
    for split in splits:
        file = split_file(base, split)
        entries = _load_jsonl(file) if file.suffix == ".jsonl" else _entries(file, _load_json(file), "eval items")
        out[split] = _items(file, entries, base, seen=seen)
    return out
