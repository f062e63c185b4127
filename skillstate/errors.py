"""Exceptions raised by skillstate.

`UserError` and its subclasses describe a problem with what the user asked
for (a bad config value, an unknown run, a malformed data file). The CLI turns
them into one line on stderr and exit code 2. Anything else is a bug.
An error message that echoes a long input is cut to a readable length
(`clip`): the head and the tail stay, so the hint at the end is kept.
"""

# Longer error lines are cut in the middle: a 5 MB config value must not make a 5 MB error line.
MAX_MESSAGE_CHARS = 500


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to about `limit` characters, keeping its head and tail and
    saying how much was left out."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 4
    return f"{text[:head]} …[{len(text) - head - tail:,} characters cut]… {text[-tail:]}"


class SkillstateError(Exception):
    """Base class of every error skillstate raises on purpose."""


class UserError(SkillstateError):
    """Bad input: config, arguments, data files, missing credentials. Its
    message is clipped (it often echoes what the user gave)."""

    def __init__(self, message: object = "", *args: object):
        super().__init__(clip(str(message)), *args)


class ConfigError(UserError):
    """A config key or value is invalid."""


class DataError(UserError):
    """A data file is missing, unreadable or malformed."""


class NotFoundError(UserError):
    """An unknown run, or a step beyond the end of a run."""


class CorruptLogError(SkillstateError):
    """The log holds an event that cannot be read or cannot follow the ones before it."""


class ConcurrencyError(SkillstateError):
    """Another writer appended to the same run first."""


class RunBusyError(ConcurrencyError):
    """Another process holds the run's lease: it is driving the run now."""


class RunStopped(SkillstateError):
    """A run stopped cleanly at an event boundary: its log ends at the last
    complete event and it is resumable. `run_id` names it, so the CLI can say
    how to resume."""

    def __init__(self, message: str, run_id: str):
        super().__init__(message)
        self.run_id = run_id


class LLMStop(RunStopped):
    """The LLM calls failed: the circuit breaker opened (CLI exit code 4), or
    an endpoint answered with an error no retry fixes (`fatal`, exit code 2)."""

    def __init__(self, message: str, run_id: str, *, fatal: bool = False):
        super().__init__(message, run_id)
        self.fatal = fatal


class StorageStop(RunStopped):
    """The database refused a write mid-run (disk full, read-only file)."""


class EnvFailure(SkillstateError):
    """The environment itself failed during a rollout (its process died, its
    code raised): not the target's fault, so never scored as a failed item."""


class TrainingFailure(EnvFailure):
    """Policy training failed on this machine (the trainer raised, the loss diverged, the local model would not
    load or generate): the run stops at its last event, resumable once fixed."""


class EnvStop(RunStopped):
    """A run stopped because its environment failed; resumable once fixed."""


class ReviewPending(RunStopped):
    """A run reached a step under `review` that nobody has decided yet (CLI exit code 5): it is saved, and
    `skillstate resume` goes on once `skillstate review` has decided the step."""

    def __init__(self, message: str, run_id: str, step: int):
        super().__init__(message, run_id)
        self.step = step


class ReplayMissError(SkillstateError):
    """Verification needed an LLM response that the log does not hold."""


class BudgetStop(RunStopped):
    """A run stopped at an event boundary because it reached max_cost_usd.
    Not a failure of the run: it is saved and resumable (CLI exit code 3)."""


class InternalError(RuntimeError):
    """A bug: the engine reached a state its own rules exclude, such as a
    stage reading the progress of a step when no step is under way. Not a
    SkillstateError on purpose: nothing should catch it as a user's problem."""
