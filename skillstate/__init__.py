"""skillstate: SkillOpt as an event-sourced state machine over a SQL log."""

__version__ = "0.1.0"
