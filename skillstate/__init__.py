"""skillstate: SkillOpt as an event-sourced state machine over a SQL log."""

__version__ = "0.1.0"

from skillstate.config import SkillConfig, build_config  # noqa: E402
from skillstate.store import Store, open_store  # noqa: E402
from skillstate.trainer import RunResult, Trainer  # noqa: E402

__all__ = ["RunResult", "SkillConfig", "Store", "Trainer", "build_config", "open_store", "__version__"]
