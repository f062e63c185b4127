"""Parsing the optimizer's JSON replies. A reply that does not parse is
recorded as such; it never aborts a step."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator


class EditIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    op: str
    target: str = ""
    content: str = ""

    @field_validator("target", "content", mode="before")
    @classmethod
    def _none_to_empty(cls, v: Any) -> Any:
        return "" if v is None else v


class AnalystReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    reasoning: str = ""
    failure_summary: list[str] = []
    edits: list[EditIn]


class MergeReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    edits: list[EditIn]


class FileEditIn(EditIn):
    """An edit of a run that trains a skill directory: it may name the file it is for."""

    file: str = ""

    @field_validator("file", mode="before")
    @classmethod
    def _file_text(cls, v: Any) -> Any:
        """A file that is not text names no file the skill holds: the edit is kept, and dropped for it later
        (never the whole reply)."""
        return v if isinstance(v, str) else "" if v is None else f"?{v!r}"[:200]


class FileAnalystReply(AnalystReply):
    edits: list[FileEditIn]  # type: ignore[assignment]


class FileMergeReply(MergeReply):
    edits: list[FileEditIn]  # type: ignore[assignment]


class SuggestionReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    reasoning: str = ""
    failure_summary: list[str] = []
    suggestions: list[str]


class SkillReply(BaseModel):
    """A whole skill: full-rewrite analysts, skill merges and the rewrite call."""

    model_config = ConfigDict(extra="ignore")

    reasoning: str = ""
    failure_summary: list[str] = []
    skill: str


class GuidanceReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    reasoning: str = ""
    guidance: str


class MemoReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    memo: str


class RankReply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    selected_indices: list[int]


Reply = TypeVar("Reply", bound=BaseModel)

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The first JSON object in a reply, also inside a ``` fence."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        for start in (i for i, ch in enumerate(candidate) if ch == "{"):
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def parse_reply(text: str, model: type[Reply]) -> Reply | None:
    """The reply as `model`, or None when it is not JSON of that shape."""
    data = extract_json(text)
    if data is None:
        return None
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def response_format(mode: str, reply: type[BaseModel] | None) -> dict[str, Any] | None:
    """The `response_format` an optimizer request carries: none for `text`;
    the reply's JSON schema for `json_schema` (JSON mode when the call has no
    fixed shape); JSON mode for `json_object`."""
    if mode == "text":
        return None
    if mode == "json_schema" and reply is not None:
        return {"type": "json_schema", "json_schema": {"name": reply.__name__, "schema": reply.model_json_schema()}}
    return {"type": "json_object"}
