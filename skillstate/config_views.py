"""A run configuration read in and written out: validation with one-line
errors (an unknown key names the closest known one), the keys a resume may
change, the flattened key list, and the views of a config stored in the
log (secrets masked) and read back from it. The model itself is
`skillstate.config.SkillConfig`."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from skillstate.config import SkillConfig
from skillstate.errors import ConfigError
from skillstate.util import redact

# Keys that change how a run reaches its models but not what it computes:
# they may differ when a run is resumed.
RUNTIME_KEYS = {
    "concurrency", "executor", "ray_address", "ray_num_cpus",
    "max_cost_usd", "prices", "max_consecutive_failures", "max_stage_failure_share",
    "stop_after_no_improvement", "target_score", "max_wall_seconds", "stop_file",
    "overlap_start", "speculative_rollout", "policy.torch_threads", "bank.embedding_batch",
    "review_timeout", "review_default",
    "optimizer.base_url", "optimizer.api_key_env", "optimizer.timeout", "optimizer.max_retries",
    "optimizer.azure", "optimizer.api_version",
    "target.base_url", "target.api_key_env", "target.timeout", "target.max_retries",
    "target.azure", "target.api_version", "target.check_tools",
    "judge.base_url", "judge.api_key_env", "judge.timeout", "judge.max_retries", "judge.azure", "judge.api_version",
}


# Keys whose value is one mapping (not nested config): NAME -> value.
DICT_KEYS = ("prompts", "prices", "env_config", "extra_body")


def flatten_keys(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        path = f"{prefix}{key}"
        if isinstance(item, dict) and key not in DICT_KEYS:
            out.update(flatten_keys(item, path + "."))
        else:
            out[path] = item
    return out


def config_keys() -> list[str]:
    return sorted(flatten_keys(SkillConfig().model_dump()))


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "config"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return unknown_key(loc)
    return f"invalid config value for {loc}: {msg}"


def sections() -> dict[str, type[BaseModel]]:
    """The config's sections (target, optimizer, episode, bank): keys that hold keys, not a value."""
    out = {}
    for name, field in SkillConfig.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out[name] = field.annotation
    return out


def unknown_key(key: str) -> str:
    section = sections().get(key)
    if section is not None:
        first = next(iter(section.model_fields))
        return (f"'{key}' is a section of the config, not a value: set one of its keys, e.g. "
                f"--set {key}.{first}=... (in a config file, {key}: {{{first}: ...}})")
    close = difflib.get_close_matches(key, config_keys(), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown config key '{key}'{hint}"


def validate_config(data: dict[str, Any]) -> SkillConfig:
    try:
        return SkillConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def stored_config(data: dict[str, Any]) -> SkillConfig:
    """The config a run's log holds, read back: validated, but not held to the
    checks of `Section` added after older runs were written (empty strings,
    booleans as numbers, negative prices, target_score above 1)."""
    try:
        return SkillConfig.model_validate(data, context={"stored": True})
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def public_config(cfg: SkillConfig) -> dict[str, Any]:
    """The config as stored in the log: plain JSON data, secrets masked."""
    data = cfg.model_dump(mode="json")
    for role in ("optimizer", "target", "judge"):
        if data[role].get("base_url"):
            data[role]["base_url"] = redact(data[role]["base_url"])
    if data.get("ray_address"):
        data["ray_address"] = redact(data["ray_address"])
    return data


def semantic_view(data: dict[str, Any]) -> dict[str, Any]:
    """The flattened config without runtime-only keys, for resume checks."""
    return {k: v for k, v in flatten_keys(data).items() if k not in RUNTIME_KEYS}
