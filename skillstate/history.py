"""Old path of skillstate.reading.history, kept because the README's Python API names
`skillstate.history.replay`: re-exports the public names; new code imports skillstate.reading.history."""

from skillstate.reading.history import (
    Snapshot,
    cost_summary,
    replay,
    run_summary,
    skill_at,
    skill_diff,
    status_of,
    with_failed_tokens,
)

__all__ = ["Snapshot", "cost_summary", "replay", "run_summary", "skill_at", "skill_diff", "status_of",
           "with_failed_tokens"]
