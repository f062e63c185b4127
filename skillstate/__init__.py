"""skillstate: SkillOpt as an event-sourced state machine over a SQL log."""

import importlib as _importlib
import typing as _typing

__version__ = "0.2.0"

__all__ = ["RunResult", "SkillConfig", "Store", "Trainer", "build_config", "evaluate_skill", "open_store",
           "__version__"]

# The public names load on first use (PEP 562): `import skillstate.cli`, and so
# `skillstate --help`, then loads neither SQLAlchemy, pydantic nor the engine.
_LAZY = {"SkillConfig": "skillstate.config", "build_config": "skillstate.config_sources",
         "Store": "skillstate.storage.store", "open_store": "skillstate.storage.store",
         "RunResult": "skillstate.trainer", "Trainer": "skillstate.trainer",
         "evaluate_skill": "skillstate.trainer"}

if _typing.TYPE_CHECKING:
    from skillstate.config import SkillConfig
    from skillstate.config_sources import build_config
    from skillstate.storage.store import Store, open_store
    from skillstate.trainer import RunResult, Trainer, evaluate_skill


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skillstate' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
