"""Where a config comes from: a YAML or TOML file (its relative paths made
absolute, its values' types checked strictly), `key=value` overrides with
dotted keys (`target.model=gpt-4o-mini`), and a base such as a stored run's
config; `build_config` merges them in that order and validates the result
(`skillstate.config`)."""

from __future__ import annotations

import copy
import os
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from skillstate.config import SkillConfig
from skillstate.config_views import DICT_KEYS, config_keys, flatten_keys, unknown_key, validate_config
from skillstate.envs.run_paths import name_run_paths
from skillstate.errors import ConfigError
from skillstate.input_files import read_input_text
from skillstate.prompts import is_prompt_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or TOML file into a plain dict (not yet validated), with
    its relative paths made absolute (see `_resolve_paths`)."""
    if not str(path).strip():
        raise ConfigError("the config file name is empty (leave --config out for no config file)")
    path = Path(path)
    name_run_paths([path])  # what a run's config holds is no agent's to read
    try:
        text = read_input_text(path, encoding="utf-8-sig")  # a BOM at the start is fine
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {err.start}); is it a YAML or TOML "
                          "file?") from None
    kind = "TOML" if path.suffix.lower() == ".toml" else "YAML"
    try:
        data = tomllib.loads(text) if kind == "TOML" else yaml.safe_load(text)
        check_shape(data)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as err:
        first_line = str(err).strip().splitlines()[0]
        raise ConfigError(f"config file {path} is not valid {kind}: {first_line}") from None
    except (RecursionError, ValueError) as err:
        raise ConfigError(f"config file {path}: {_too_big(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return _resolve_paths(data, path)


# A config is small: a few dozen keys, nested a few levels (env_config may hold more). These bounds refuse,
# quickly, what no config needs: values nested hundreds deep (a RecursionError somewhere later) and YAML
# aliases that multiply into billions of values (the "billion laughs").
MAX_DEPTH = 32
MAX_VALUES = 100_000


def check_shape(data: Any) -> None:
    """Raise ValueError when `data`, with its aliases expanded, is nested deeper
    than MAX_DEPTH or holds more than MAX_VALUES values. Stops as soon as a
    bound is passed, so an alias bomb is refused without being expanded."""
    count, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ValueError(f"more than {MAX_VALUES:,} values (with YAML aliases expanded)")
        if isinstance(value, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise ValueError(f"values nested more than {MAX_DEPTH} levels deep")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)


def _too_big(err: Exception) -> str:
    return f"values nested too deeply ({MAX_DEPTH} levels at most)" if isinstance(err, RecursionError) else str(err)


def load_value(text: str) -> Any:
    """A YAML value (a `--set` value), within the bounds of `check_shape`;
    ValueError when it is too deep or too big, yaml.YAMLError when it is not YAML."""
    try:
        value = yaml.safe_load(text)
    except RecursionError as err:
        raise ValueError(_too_big(err)) from None
    check_shape(value)
    return value


def _resolve_paths(data: dict[str, Any], file: Path) -> dict[str, Any]:
    """`data`, `initial_skill`, the prompt overrides that name a file and the files an agent harness's command
    names are relative to the config file's folder: make them absolute."""
    folder = Path(os.path.abspath(file)).parent

    def absolute(value: Any) -> Any:
        if not isinstance(value, str) or not value.strip():
            return value
        path = Path(value.strip()).expanduser()
        return value if path.is_absolute() else os.path.normpath(folder / path)

    out = {key: absolute(data[key]) if key in ("data", "initial_skill") else value for key, value in data.items()}
    if isinstance(data.get("distractor_skills"), list):
        out["distractor_skills"] = [absolute(v) for v in data["distractor_skills"]]
    elif isinstance(data.get("distractor_skills"), str):  # one path
        out["distractor_skills"] = [absolute(data["distractor_skills"])]
    if isinstance(data.get("prompts"), dict):
        out["prompts"] = {name: absolute(value) if isinstance(value, str) and is_prompt_file(value) else value
                          for name, value in data["prompts"].items()}
    harness = data.get("env_config", {}).get("harness") if isinstance(data.get("env_config"), dict) else None
    if isinstance(harness, dict) and isinstance(harness.get("command"), list):  # an agent program beside the config
        named = [absolute(a) if isinstance(a, str) and (folder / a).is_file() and not os.path.isabs(a) else a
                 for a in harness["command"]]
        out["env_config"] = {**data["env_config"], "harness": {**harness, "command": named}}
    return out


@cache
def _field_adapter(key: str) -> TypeAdapter[Any] | None:
    """A validator of the type of a flattened config key (no bounds), or None for an unknown key."""
    model: Any = SkillConfig
    *parents, name = key.split(".")
    for part in parents:
        field = model.model_fields.get(part)
        model = field.annotation if field else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    field = model.model_fields.get(name)
    return TypeAdapter(field.annotation) if field else None


def _as_tuples(value: Any) -> Any:
    """TOML and YAML have no tuples: a list stands for one (`prices`)."""
    if isinstance(value, dict):
        return {k: _as_tuples(v) for k, v in value.items()}
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def _check_file_types(flat: dict[str, Any], file: str | Path) -> None:
    """Refuse a value of the wrong type in a config file even where it could
    be converted: `num_epochs = "1"`, `use_gate: "yes"`. (`--set` values are
    typed by YAML and validated as usual.)"""
    for key, value in flat.items():
        adapter = _field_adapter(key)
        if adapter is None:
            continue
        try:
            adapter.validate_python(_as_tuples(value), strict=True)
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join([key, *(str(p) for p in first["loc"])])
            got, bad = first["input"], first["msg"].removeprefix("Value error, ")
            quoted = isinstance(got, str) and first["type"] in ("int_type", "float_type", "bool_type")
            hint = f"got the string {got!r} (write it without quotes)" if quoted else f"got {got!r}"
            raise ConfigError(f"invalid config value for {loc} in {file}: {bad}, {hint}") from None


_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` with a YAML-typed value: `epochs=2`, `failure_only=true`."""
    if "=" not in text:
        raise ConfigError(f"--set takes key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not _KEY_RE.match(key):
        raise ConfigError(f"--set: bad key {key!r}")
    try:
        value = load_value(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ValueError as err:
        raise ConfigError(f"--set {key}: {err}") from None
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c` in a nested dict; `prompts.NAME` sets one prompt override."""
    parts = key.split(".")
    if parts[0] in ("prompts", "env_config") and len(parts) == 2:
        data.setdefault(parts[0], {})[parts[1]] = value
        return
    known = set(config_keys())
    if key not in known and not (key in DICT_KEYS and isinstance(value, dict)):
        raise ConfigError(unknown_key(key))
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply flat dotted overrides to a nested config dict (a new dict)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        set_dotted(out, key, value)
    return out


def merge_dicts(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: values in `extra` win (a new dict)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in DICT_KEYS:
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = value
    return out


def build_config(file: str | Path | None = None, overrides: dict[str, Any] | None = None,
                 base: dict[str, Any] | None = None) -> SkillConfig:
    """`base` (defaults), then the file, then overrides; everything validated."""
    data = load_config_file(file) if file is not None else {}
    flat_file = flatten_keys(data)
    unknown = [k for k in flat_file if k not in set(config_keys()) and not k.startswith(DICT_KEYS)]
    if unknown:
        raise ConfigError(unknown_key(unknown[0]))
    if file is not None:
        _check_file_types(flat_file, file)
    return validate_config(merge_overrides(merge_dicts(base or {}, data), overrides or {}))
