"""Question answering: one question, one reply, scored against `answers`.

Hard score: 1 if a normalised answer equals the normalised prediction or
appears in it as a whole-word substring; soft score: best token F1.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from skillstate.envs.base import Complete, RolloutOutcome, SkillEnv
from skillstate.errors import DataError
from skillstate.input_files import read_input_text, split_file
from skillstate.prompts import render

DEFAULT_SKILL = """# Question answering

Answer the user's question accurately and concisely.
"""


class QAItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    question: str
    answers: list[str]
    context: str | None = None
    task_type: str = ""

    @field_validator("id", mode="before")
    @classmethod
    def _id_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @field_validator("answers")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v or not any(a.strip() for a in v):
            raise ValueError("answers must hold at least one non-empty answer")
        return v


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction: str, answer: str) -> float:
    pred, gold = normalize(prediction).split(), normalize(answer).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def score_answer(prediction: str, answers: list[str]) -> tuple[float, float, str]:
    """(hard, soft, fail_reason) of a prediction."""
    pred = normalize(prediction)
    golds = [normalize(a) for a in answers if normalize(a)]
    soft = max((token_f1(prediction, a) for a in answers), default=0.0)
    if not pred:
        return 0.0, soft, "empty_answer"
    padded = f" {pred} "
    if any(pred == g or f" {g} " in padded for g in golds):
        return 1.0, soft, ""
    return 0.0, soft, f"wrong_answer: expected {answers[0]!r}, got {prediction.strip()[:200]!r}"


def _read_items(path: Path, model: type[BaseModel]) -> list[dict[str, Any]]:
    try:
        text = read_input_text(path, encoding="utf-8-sig")  # a BOM at the start is fine
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    items, seen = [], set()
    for n, obj in _parse_json(path, text):
        if not isinstance(obj, dict):
            raise DataError(f"{path}: item {n} is not a JSON object")
        try:
            item = model.model_validate(obj)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "item"
            raise DataError(f"{path}: item {n}: {field}: {first['msg']}") from None
        item_id = item.id  # type: ignore[attr-defined]  # every item model has an id (envs.base.Item)
        if item_id in seen:
            raise DataError(f"{path}: duplicate id {item_id!r}")
        seen.add(item_id)
        items.append(item.model_dump(exclude_none=True))
    if not items:
        raise DataError(f"{path}: no items")
    return items


def _parse_json(path: Path, text: str) -> list[tuple[int, Any]]:
    """(number, value) of each item: a JSON array (numbered by position) or
    JSONL, one value per line (numbered by line)."""
    try:
        return _parse_json_values(path, text)
    except RecursionError:
        raise DataError(f"{path}: values nested too deeply to read") from None


def _parse_json_values(path: Path, text: str) -> list[tuple[int, Any]]:
    not_array = DataError(f"{path}: holds a single JSON object; expected a JSON array of items [{{...}}, ...] "
                          "or one JSON object per line (JSONL)")
    if text.lstrip().startswith("["):
        try:
            return list(enumerate(json.loads(text), 1))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    values: list[tuple[int, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append((n, json.loads(line)))
        except json.JSONDecodeError as err:
            if _is_one_object(text):  # a pretty-printed object
                raise not_array from None
            raise DataError(f"{path}: not valid JSON (line {n}: {err.msg})") from None
    if path.suffix.lower() == ".json" and len(values) == 1 and isinstance(values[0][1], dict):
        raise not_array
    return values


def _is_one_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def load_dataset_dir(path: str | Path, splits: list[str],
                     item_model: type[BaseModel] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Read DIR/<split>.jsonl (or .json) for each split, validating each item
    with `item_model` (default: a question-answering item)."""
    model = item_model or QAItem
    base = Path(path).expanduser()
    expected = ", ".join(f"{s}.jsonl" for s in splits)
    if base.is_file():
        raise DataError(f"data path {base} is a file; expected a directory holding {expected}")
    if not base.is_dir():
        raise DataError(f"data directory {base} does not exist")
    out: dict[str, list[dict[str, Any]]] = {}
    for split in splits:
        out[split] = _read_items(split_file(base, split), model)
    ids = Counter(item["id"] for items in out.values() for item in items)
    dup = next((i for i, c in ids.items() if c > 1), None)
    if dup is not None:
        raise DataError(f"{base}: id {dup!r} appears in more than one split")
    return out


class QAEnv(SkillEnv):
    kind = "qa"
    item_model = QAItem

    def default_skill(self) -> str:
        return DEFAULT_SKILL

    def user_message(self, item: dict[str, Any], prompts: dict[str, str]) -> str:
        context = item.get("context")
        block = f"Context:\n{context}\n" if context else ""
        return render(prompts["qa_user"], question=item["question"], context_block=block).strip() + "\n"

    def rollout(self, skill: str, item: dict[str, Any], complete: Complete, prompts: dict[str, str]) -> RolloutOutcome:
        messages = [{"role": "system", "content": skill}, {"role": "user", "content": self.user_message(item, prompts)}]
        result = complete(messages)
        task_type = item.get("task_type", "")
        if not result.ok:
            return RolloutOutcome(0.0, 0.0, f"rollout_error: {result.error}", "", messages, task_type, result)
        hard, soft, reason = self.score(result.text, item)
        if result.truncated and reason:  # a wrong answer that ran out of tokens says so
            reason += " (reply truncated at max_tokens)"
        convo = messages + [{"role": "assistant", "content": result.text}]
        return RolloutOutcome(hard, soft, reason, result.text, convo, task_type, result)

    def score(self, prediction: str, item: dict[str, Any]) -> tuple[float, float, str]:
        """(hard, soft, fail_reason) of a reply; a subclass may score differently."""
        return score_answer(prediction, item["answers"])

    def describe_item(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"id": item["id"], "task_type": item.get("task_type", ""), "expected": item["answers"]}
