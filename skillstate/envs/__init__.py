"""Environments: where the target's tasks come from and how they are scored."""

from skillstate.envs.base import RolloutOutcome, SkillEnv
from skillstate.envs.qa import QAEnv, load_dataset_dir

__all__ = ["QAEnv", "RolloutOutcome", "SkillEnv", "load_dataset_dir"]
