"""SkillOpt's pure rules: how a skill is edited and an edit is judged.

Applying an optimizer's edits to a skill document (editor), the learning-rate
schedule (scheduler), the gate that accepts or rejects a step and its robust
variants (gate, gate_robust), the guidance and screening of candidate edits
(guidance, screen), repair of a failed step (repair), prune and the final
selection of the skill to keep (prune, final_selection). Every function here is
pure: it may import skillstate.log (the event and value types),
skillstate.errors, skillstate.util and skillstate.config_section; never
storage, the engine or an LLM backend. The engine calls these rules and writes
their verdicts as events.
"""
