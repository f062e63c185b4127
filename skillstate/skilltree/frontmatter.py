"""SKILL.md's YAML front matter: read it, and change one field without disturbing the rest.

The front matter is the text between a first line `---` and the next line `---`. It is kept as
written: `parse_front_matter` reads it into values but never rewrites it, and `set_field` replaces
the lines of one top-level key (or adds it at the end), leaving the order, the other keys, the
comments and the line endings as they were.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from skillstate.errors import UserError

_FENCE = re.compile(r"---[ \t]*(\r?\n|$)")


@dataclass(frozen=True)
class FrontMatter:
    """A SKILL.md split in three: `fields` (the parsed YAML mapping, in its order), `yaml_text`
    (the raw text between the fences), and `body` (everything after the closing fence), which
    starts on line `body_line` (1-based) of the file."""

    fields: Mapping[str, Any]
    yaml_text: str
    body: str
    body_line: int


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice (YAML keeps the last silently)."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} appears twice",
                                                    key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _split(text: str) -> tuple[str, str, int] | None:
    """(yaml text, body, body line) of a text that opens with a fence, else None; `UserError` when
    the front matter is never closed."""
    opening = _FENCE.match(text)
    if opening is None:
        return None
    start = opening.end()
    for closing in re.finditer(r"(?m)^---[ \t]*(\r?\n|$)", text[start:]):
        yaml_text = text[start:start + closing.start()]
        body = text[start + closing.end():]
        return yaml_text, body, text[:start + closing.end()].count("\n") + 1
    raise UserError("the front matter opened by the first line '---' is never closed by another '---' line")


def has_front_matter(text: str) -> bool:
    """Whether `text` opens with a `---` line (a front matter, closed or not)."""
    return _FENCE.match(text) is not None


def parse_front_matter(text: str) -> FrontMatter | None:
    """The front matter of a SKILL.md, or None when it has none. `UserError` in one line when it
    is not closed, not valid YAML, not a mapping, or repeats a key."""
    split = _split(text)
    if split is None:
        return None
    yaml_text, body, body_line = split
    try:
        fields = yaml.load(yaml_text, Loader=_UniqueKeyLoader) if yaml_text.strip() else {}
    except yaml.YAMLError as err:
        raise UserError(f"the front matter is not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(fields, dict):
        raise UserError(f"the front matter must be a YAML mapping (key: value lines), not a {type(fields).__name__}")
    bad = [k for k in fields if not isinstance(k, str)]
    if bad:
        raise UserError(f"the front matter's keys must be strings, not {bad[0]!r}")
    return FrontMatter(fields, yaml_text, body, body_line)


def front_matter_or_none(text: str) -> FrontMatter | None:
    """`parse_front_matter`, with None also for a front matter that does not read (an edit left it broken)."""
    try:
        return parse_front_matter(text)
    except UserError:
        return None


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f" (line {mark.line + 2})" if mark is not None else ""  # +1 for 1-based, +1 for the fence
    return f"{problem}{where}"


def _dump(key: str, value: Any) -> str:
    """`key: value` as YAML lines; characters YAML reads as line breaks (NEL) are escaped."""
    for readable in (True, False):
        dumped = yaml.safe_dump({key: value}, sort_keys=False, allow_unicode=readable, width=2**31 - 1,
                                default_flow_style=False)
        if yaml.safe_load(dumped) == {key: value}:
            break
    return dumped


def set_field(text: str, key: str, value: Any) -> str:
    """`text` (a SKILL.md) with the top-level front-matter `key` set to `value`: its lines are
    replaced in place, or the key is added last. Nothing else in the file changes. `UserError`
    when the file has no front matter, or when the change would not read back as asked (a key
    written in a form this edit does not handle, such as a flow mapping)."""
    split = _split(text)
    if split is None:
        raise UserError("SKILL.md has no front matter to set a field in")
    yaml_text, _body, _line = split
    old = parse_front_matter(text)
    newline = "\r\n" if "\r\n" in yaml_text else "\n"
    lines = re.findall(r"[^\n]*\n|[^\n]+$", yaml_text)  # "\n" only: YAML text may hold U+2028 and the like
    start = next((i for i, line in enumerate(lines) if re.match(rf"{re.escape(key)}[ \t]*:", line)), None)
    dumped = _dump(key, value).replace("\n", newline)
    if start is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += newline
        lines.append(dumped)
    else:
        end = start + 1
        while end < len(lines) and (lines[end][:1] in (" ", "\t") or not lines[end].strip()):
            end += 1
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        lines[start:end] = [dumped]
    fence = _FENCE.match(text)
    assert fence is not None
    new_yaml = "".join(lines)
    new_text = text[:fence.end()] + new_yaml + text[fence.end() + len(yaml_text):]
    new = parse_front_matter(new_text)
    expected = {**(old.fields if old else {}), key: value}
    if new is None or dict(new.fields) != expected:
        raise UserError(f"cannot set {key!r} in this front matter without rewriting it (edit it by hand)")
    return new_text


def add_front_matter(markdown: str, fields: Mapping[str, Any]) -> str:
    """A plain markdown document with a front matter of `fields` (in their order) put before it."""
    if has_front_matter(markdown):
        raise UserError("this markdown already has a front matter")
    newline = "\r\n" if "\r\n" in markdown else "\n"
    dumped = "".join(_dump(k, v) for k, v in fields.items()).replace("\n", newline)
    return f"---{newline}{dumped}---{newline}{markdown}"
