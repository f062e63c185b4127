"""Reading a run for people: what happened, and why.

The history of a run and its replay (history), learning curves and cost
(curves), where a skill's lines came from (provenance, bank_provenance), one
step in detail (step_detail), the audit that re-folds and verifies a log
(audit), the plan of a run before it starts (plan), failures and tool use
(failures, tool_use) and the final selection's report (selection_report).
These modules only read: they may import skillstate.log, skillstate.storage,
skillstate.skillopt, skillstate.config, skillstate.pricing, the engine's
loading helpers (skillstate.engine.runner, skillstate.engine.loading) and the
registries; they never append an event and never call an LLM. The CLI and the
dashboard render what they return.
"""
