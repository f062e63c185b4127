"""The simulated world: a deterministic, offline stand-in for both LLMs.

It is a simulation for demos and tests, not a model of any real LLM. The
simulated target knows every item's answer but gives it reliably only when
the skill states the rule for that item's task type; some rules hurt. The
simulated optimizer reads the failures in its prompt and proposes edits: the
right rule for a failing task type more often than not, but also useless and
harmful ones. So a default run learns, and the gate has things to reject.
"""

from skillstate.sim.world import SimWorld, bundled_skill, bundled_splits

__all__ = ["SimWorld", "bundled_splits", "bundled_skill"]
