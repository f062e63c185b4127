"""Loading and rendering the prompt templates.

The templates are markdown files in `skillstate/prompts/` with `$name`
placeholders. A run may override any of them (config key `prompts`, a file
path or inline text); the texts a run uses are stored in its log, so resume,
fork and verify never depend on the installed files.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from string import Template

from skillstate.errors import ConfigError

PROMPT_NAMES = (
    "qa_user", "optimizer_system", "failure_analyst", "success_analyst", "merge", "merge_final", "rank",
    # full SkillOpt: update modes, autonomous learning rate, epoch boundary
    "failure_suggestions", "success_suggestions", "rewrite", "failure_rewrite", "success_rewrite", "merge_skills",
    "learning_rate", "slow_update", "meta_skill", "prune",
    # multi-turn environments
    "episode_user",
    # progressive disclosure (disclosure: tools)
    "disclosure_system",
    # the skill bank (mode: bank)
    "distill", "evolve",
    # a skill's own evals (env evals): the task as the target sees it, and the judge
    "evals_user", "judge_system", "judge_user",
)


def builtin(name: str) -> str:
    return resources.files("skillstate.prompts").joinpath(f"{name}.md").read_text(encoding="utf-8")


def resolve_prompts(overrides: dict[str, str]) -> dict[str, str]:
    """Every prompt's text for a run: the built-in one unless overridden."""
    unknown = sorted(set(overrides) - set(PROMPT_NAMES))
    if unknown:
        raise ConfigError(f"unknown prompt {unknown[0]!r} (prompts are: {', '.join(PROMPT_NAMES)})")
    texts = {name: builtin(name) for name in PROMPT_NAMES}
    for name, value in overrides.items():
        texts[name] = _read_override(name, value)
    return texts


def is_prompt_file(value: str) -> bool:
    """Whether a prompt override names a file (one line ending in .md or .txt) rather than holding the text."""
    return "\n" not in value and value.strip().endswith((".md", ".txt"))


def _read_override(name: str, value: str) -> str:
    if is_prompt_file(value):
        from skillstate.input_files import read_input_text

        path = Path(value.strip()).expanduser()
        try:
            text = read_input_text(path)
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"prompt {name}: cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
        if not text.strip():
            raise ConfigError(f"prompt {name}: {path} is empty; remove the override to use the built-in prompt")
        return text
    return value


def render(template: str, **values: object) -> str:
    return Template(template).safe_substitute({k: str(v) for k, v in values.items()})
