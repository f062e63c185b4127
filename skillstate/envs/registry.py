"""Environments by name: the built-in ones, those installed packages register
under the entry point group `skillstate.envs`, and `python:MODULE:CLASS` for
a class importable from the Python path. Every failure is one ConfigError."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ValidationError

from skillstate.envs.base import SkillEnv
from skillstate.errors import ConfigError

BUILTIN: dict[str, str] = {
    "qa": "skillstate.envs.qa:QAEnv",
    "evals": "skillstate.envs.skill_evals:EvalsEnv",
    "sql": "skillstate.envs.sql:SqlEnv",
    "workspace": "skillstate.envs.workspace.env:WorkspaceEnv",
    "textworld_express": "skillstate.envs.textworlds.twx:TextWorldExpress",
    "scienceworld": "skillstate.envs.textworlds.scienceworld:ScienceWorld",
}
ENTRY_POINT_GROUP = "skillstate.envs"
PYTHON_PREFIX = "python:"


def _installed() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_names() -> list[str]:
    return sorted(set(BUILTIN) | set(_installed()))


def _load(target: str, name: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"env {name!r}: write python:MODULE:CLASS, e.g. python:my_pkg.envs:MyEnv")
    try:
        module = importlib.import_module(module_name)
    except SystemExit as err:  # the module ends the process when imported: not an environment, and not a success
        raise ConfigError(f"env {name!r}: importing {module_name} called sys.exit({err.code!r}); an environment's "
                          "module must not exit when imported") from None
    except Exception as err:  # ImportError, or the module's own error at import time
        raise ConfigError(f"env {name!r}: cannot import {module_name}: {type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"env {name!r}: module {module_name} has no {attr}") from None


def resolve_env(name: str) -> type[SkillEnv]:
    """The environment class `name` stands for."""
    if name.startswith(PYTHON_PREFIX):
        cls = _load(name[len(PYTHON_PREFIX):], name)
    elif name in BUILTIN:
        cls = _load(BUILTIN[name], name)
    else:
        installed = _installed()
        if name not in installed:
            raise ConfigError(f"unknown env {name!r} (known: {', '.join(known_names())}; or python:MODULE:CLASS)")
        try:
            cls = installed[name].load()
        except SystemExit as err:
            raise ConfigError(f"env {name!r}: loading its entry point {installed[name].value} called "
                              f"sys.exit({err.code!r})") from None
        except Exception as err:
            raise ConfigError(f"env {name!r}: its entry point {installed[name].value} fails to load: "
                              f"{type(err).__name__}: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, SkillEnv)):
        raise ConfigError(f"env {name!r} is not a skillstate environment (a subclass of skillstate.envs.SkillEnv)")
    return cls


def env_settings(cls: type[SkillEnv], raw: dict[str, Any], name: str) -> BaseModel:
    """The environment's `env_config`, validated by its own model."""
    try:
        return cls.config_model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "env_config"
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = f"env {name!r} has no such setting"
        raise ConfigError(f"invalid env_config.{where}: {msg}") from None


def make_env(name: str, raw_config: dict[str, Any], splits: dict[str, list[dict[str, Any]]],
             run_config: Any = None) -> SkillEnv:
    """An environment on `splits`; `run_config` (a SkillConfig) gives a
    multi-turn environment its episode settings."""
    cls = resolve_env(name)
    cls.check_requirements()
    env = construct_env(cls, splits, env_settings(cls, raw_config, name), name)
    if run_config is not None:
        apply_settings(env, run_config)
    return env


def construct_env(cls: type[SkillEnv], splits: dict[str, list[dict[str, Any]]], settings: BaseModel,
                  name: str) -> SkillEnv:
    """`cls(splits, settings)`; a constructor that raises is one ConfigError naming the class and the error."""
    try:
        return cls(splits, settings)
    except SystemExit as err:
        raise ConfigError(f"env {name!r}: {cls.__module__}.{cls.__qualname__}() called sys.exit({err.code!r})") \
            from None
    except Exception as err:
        from skillstate.util import first_line

        raise ConfigError(f"env {name!r}: {cls.__module__}.{cls.__qualname__}() failed: {type(err).__name__}: "
                          f"{first_line(err, '')[:300]}".rstrip(": ")) from None


def apply_settings(env: SkillEnv, run_config: Any) -> None:
    from skillstate.envs.episode import EpisodeEnv, EpisodeSettings
    from skillstate.envs.tools import ToolEnv

    if getattr(env, "uses_judge", False):
        env.judge_samples = run_config.judge.samples  # type: ignore[attr-defined]
    if isinstance(env, (EpisodeEnv, ToolEnv)):
        env.settings = EpisodeSettings(**run_config.episode.model_dump(), seed=run_config.seed,
                                       workers=run_config.concurrency)
