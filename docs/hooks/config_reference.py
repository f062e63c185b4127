"""MkDocs hook: the config reference's tables, generated from `SkillConfig` at build time.

docs/reference/config.md holds the prose; each marker line below is replaced by what it names:

- `<!-- generated: config keys -->`: one table of the top-level keys and one per section
  (`target`, `optimizer`, `episode`, `bank`, `sim`, `final_selection`), each key with its type,
  bounds, default and description, read from the pydantic fields of `skillstate.config.SkillConfig`;
- `<!-- generated: prompt names -->`: the prompts a run may override (`skillstate.prompts.PROMPT_NAMES`);
- `<!-- generated: default prices -->`: the built-in price table (`skillstate.pricing.DEFAULT_PRICES`).

A field's description is its `Field(description=...)`. The few fields that have none yet take theirs
from MISSING_DESCRIPTIONS below (the only hand-written descriptions here); a field with neither fails
the build, and so does an entry of MISSING_DESCRIPTIONS whose field has since gained a description or
no longer exists, so that the table can never drift from the model.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, Union, get_args, get_origin

from mkdocs.exceptions import PluginError
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

PAGE = "reference/config.md"

# Descriptions of the fields that have no `description=` in skillstate yet (taken from the README's
# former hand-written config table). Move each into its Field and delete it here.
MISSING_DESCRIPTIONS: dict[str, str] = {}

# The guide that explains a key (or a section), linked from its row. Paths are relative to PAGE.
GUIDES = {
    "env": "../environments.md#your-own-environment",
    "env_config": "../environments.md#your-own-environment",
    "data": "../environments.md#data",
    "backend": "../endpoints.md",
    "optimizer": "../endpoints.md",
    "target": "../endpoints.md",
    "episode": "../agents.md",
    "mode": "../skill-bank.md",
    "bank": "../skill-bank.md",
    "sim": "../sim.md",
    "final_selection": "../noisy-targets.md#picking-the-final-skill-on-held-out-items",
    "lr_scheduler": "../concepts.md",
    "gate_rule": "../noisy-targets.md#a-gate-for-noisy-targets",
    "gate_confidence": "../noisy-targets.md#a-gate-for-noisy-targets",
    "gate_type_margin": "../noisy-targets.md#a-gate-for-noisy-targets",
    "gate_length_penalty": "../noisy-targets.md#pruning-and-a-length-penalty-in-the-gate",
    "prune": "../noisy-targets.md#pruning-and-a-length-penalty-in-the-gate",
    "prune_max_lines": "../noisy-targets.md#pruning-and-a-length-penalty-in-the-gate",
    "repair": "../noisy-targets.md#repairing-a-candidate-edits-that-did-harm",
    "repair_max_edits": "../noisy-targets.md#repairing-a-candidate-edits-that-did-harm",
    "repair_type_loss": "../noisy-targets.md#repairing-a-candidate-edits-that-did-harm",
    "repair_full_evaluation": "../noisy-targets.md#repairing-a-candidate-edits-that-did-harm",
    "parent_selection": "../noisy-targets.md#drawing-each-steps-parent-from-a-front",
    "drop_rejected_edits": "../noisy-targets.md#leaving-out-edits-that-failed-before",
    "use_gate": "../skillopt.md",
    "review": "../review.md",
    "review_timeout": "../review.md#waiting-without-a-person",
    "review_default": "../review.md#waiting-without-a-person",
    "drop_noop_edits": "../fewer-calls.md",
    "early_reject": "../fewer-calls.md",
    "early_reject_slow_update": "../fewer-calls.md",
    "overlap_start": "../fewer-calls.md#keeping-the-concurrency-cap-full",
    "speculative_rollout": "../fewer-calls.md#keeping-the-concurrency-cap-full",
    "semantic_density_weight": "../skillopt.md",
    "use_step_buffer": "../skillopt.md",
    "lr_control": "../skillopt.md",
    "update_mode": "../skillopt.md",
    "accumulation": "../skillopt.md",
    "use_slow_update": "../skillopt.md",
    "slow_update_samples": "../skillopt.md",
    "longitudinal_pair_policy": "../skillopt.md",
    "slow_update_gate": "../skillopt.md",
    "use_meta_skill": "../skillopt.md",
    "max_cost_usd": "../cost.md",
    "prices": "#default-prices",
    "samples": "../skill-bank.md",
    "stop_after_no_improvement": "../cost.md#stopping-when-there-is-nothing-left-to-gain",
    "target_score": "../cost.md#stopping-when-there-is-nothing-left-to-gain",
    "max_wall_seconds": "../cost.md#stopping-when-there-is-nothing-left-to-gain",
    "stop_file": "../cost.md#stopping-when-there-is-nothing-left-to-gain",
    "executor": "../ray.md",
    "ray_address": "../ray.md",
    "ray_num_cpus": "../ray.md",
    "max_consecutive_failures": "../endpoints.md#when-the-llm-fails",
    "max_stage_failure_share": "../endpoints.md#when-the-llm-fails",
    "prompts": "#prompt-names",
    "llm_cache": "../team-store.md",
}


def _escape(text: str) -> str:
    """Plain text for a table cell: no HTML, emphasis or column break."""
    for raw, safe in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("|", "\\|")):
        text = text.replace(raw, safe)
    return " ".join(text.split())


def _value(value: Any) -> str:
    """A default as it is written in a config file (YAML)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict) and not value:
        return "`{}`"
    return f"`{value}`"


def _type(annotation: Any) -> str:
    """An annotation in words, with no `|` (a table's column break)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is Union or (origin is not None and type(None) in args):
        rest = [a for a in args if a is not type(None)]
        inner = " or ".join(_type(a) for a in rest)
        return f"{inner} or none" if type(None) in args else inner
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}"
    if origin is tuple:
        return "[" + ", ".join(_type(a) for a in args) + "]"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return f"`{getattr(annotation, '__name__', annotation)}`"


def _bounds(field: Any) -> str:
    words = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out = []
    for meta in field.metadata:
        for attr, sign in words.items():
            bound = getattr(meta, attr, None)
            if bound is not None:
                out.append(f"{sign} {bound:,}" if isinstance(bound, int) else f"{sign} {bound}")
    return ", ".join(out)


def _default(field: Any) -> Any:
    if field.default is not PydanticUndefined:
        return field.default
    return field.default_factory()


def _section(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _description(key: str, field: Any) -> str:
    if field.description:
        return field.description
    section = _section(field.annotation)
    if section is not None:
        return (inspect.getdoc(section) or "").split("\n\n")[0]
    if key in MISSING_DESCRIPTIONS:
        return MISSING_DESCRIPTIONS[key]
    raise PluginError(f"config key {key!r} has no description: give its Field a description= (or, for now, add "
                      f"it to MISSING_DESCRIPTIONS in docs/hooks/config_reference.py)")


def _table(model: type[BaseModel], prefix: str, runtime: set[str]) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = prefix + name
        section = _section(field.annotation)
        kind = _type(field.annotation)
        bounds = _bounds(field)
        if bounds:
            kind += f", {bounds}"
        default = f"[see below](#{name})" if section is not None else _value(_default(field))
        text = _escape(_description(key, field))
        if key in runtime:
            text += " *May change on resume.*"
        guide = GUIDES.get(key) if not prefix else None
        if guide and section is None:
            text += f" [More]({guide})"
        rows.append(f"| `{key}` | {kind} | {default} | {text} |")
    return rows


def config_tables() -> str:
    from skillstate.config import SkillConfig
    from skillstate.config_views import RUNTIME_KEYS

    runtime = set(RUNTIME_KEYS)
    stale = sorted(k for k in MISSING_DESCRIPTIONS
                   if k not in SkillConfig.model_fields or SkillConfig.model_fields[k].description)
    if stale:
        raise PluginError(f"MISSING_DESCRIPTIONS in docs/hooks/config_reference.py has entries the model now "
                          f"describes (or no longer has): {', '.join(stale)}; delete them")
    out = ["## Top-level keys", "", *_table(SkillConfig, "", runtime), ""]
    for name, field in SkillConfig.model_fields.items():
        section = _section(field.annotation)
        if section is None:
            continue
        out += [f"## `{name}`", "", _escape(inspect.getdoc(section) or "")]
        if name in GUIDES:
            out[-1] += f" See [the guide]({GUIDES[name]})."
        out += ["", *_table(section, f"{name}.", runtime), ""]
    return "\n".join(out)


def prompt_names() -> str:
    from skillstate.prompts import PROMPT_NAMES

    return ", ".join(f"`{name}`" for name in PROMPT_NAMES)


def default_prices() -> str:
    from skillstate.pricing import DEFAULT_PRICES

    rows = ["| model | USD per 1M input tokens | USD per 1M output tokens |", "|---|---|---|"]
    rows += [f"| `{model}` | {inp:g} | {out:g} |" for model, (inp, out) in DEFAULT_PRICES.items()]
    return "\n".join(rows)


MARKERS = {
    "<!-- generated: config keys -->": config_tables,
    "<!-- generated: prompt names -->": prompt_names,
    "<!-- generated: default prices -->": default_prices,
}


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    for marker, make in MARKERS.items():
        if marker not in markdown:
            raise PluginError(f"{PAGE} has lost its marker {marker}")
        markdown = markdown.replace(marker, make())
    return markdown
