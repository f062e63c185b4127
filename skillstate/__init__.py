"""skillstate: SkillOpt as an event-sourced state machine over a SQL log."""

__version__ = "0.2.0"

from skillstate.config import SkillConfig, build_config  # noqa: E402
from skillstate.store import Store, open_store  # noqa: E402
from skillstate.trainer import RunResult, Trainer, evaluate_skill  # noqa: E402

__all__ = ["RunResult", "SkillConfig", "Store", "Trainer", "build_config", "evaluate_skill", "open_store",
           "__version__"]
