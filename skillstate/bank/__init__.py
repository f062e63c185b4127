"""The pure core of the SkillRL skill-bank mode.

A bank holds many small skills in two tiers (general, and task-specific by
category) plus a short list of common mistakes. Everything in this package is
pure and deterministic: no I/O, no LLM calls. The engine records what these
functions decide as events.

- `skills`: `BankSkill`, `SkillProvenance`, `Bank`, `skill_id`
- `embedding`: the `Embedder` protocol, `cosine`, the offline `SimEmbedder`
- `dedup`: `dedupe`, which keeps near-duplicates out of the bank
- `retrieval`: template and embedding retrieval of a task's skills
- `advantages`: GRPO group-relative advantages
- `evolution`: which categories to evolve and which failures to show
- `trajectories`: the trajectory JSON format and its loader
- `export`: `render_skills`, the system message of a task's retrieved skills
"""
