"""`skillstate eval`: score any skill file on a split, as a recorded run."""

from __future__ import annotations

from typing import Any

import click

from skillstate.config import build_config
from skillstate.store import open_store

from skillstate.cli.app import cli, db_option, echo_json, parse_sets, set_option
from skillstate.cli.render import printer, summary_text


@cli.command("eval")
@click.option("--skill", "skill_file", required=True, type=click.Path(dir_okay=False),
              help="The skill (markdown) to score.")
@click.option("--split", default="test", show_default=True, help="train, val or test.")
@click.option("--data", type=click.Path(), help="Dataset directory (train/val/test .jsonl); default with "
                                                  "backend sim: the bundled simulated world.")
@click.option("--backend", type=click.Choice(["sim", "openai"]), help="LLM backend of the target.")
@click.option("--model", "--target-model", "model", help="The target model.")
@click.option("--base-url", help="OpenAI-compatible endpoint of the target.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML or TOML config file.")
@set_option
@click.option("--run-id", help="Id of the evaluation run.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines, only the results.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@db_option
def evaluate(skill_file, split, data, backend, model, base_url, config_file, assignments, run_id, quiet, as_json,
             db) -> None:
    """Score a skill file on a split, with results per task type. The
    evaluation is recorded as a run of its own (kind eval), so it shows in
    `skillstate runs` and can be audited and verified like any run.

    \b
    Examples:
        skillstate export --best > best.md && skillstate eval --skill best.md
        skillstate eval --skill my_skill.md --split val --data examples/qa
        skillstate eval --skill my_skill.md --backend openai --model gpt-4o-mini --data examples/qa
    """
    from skillstate.trainer import evaluate_skill

    overrides: dict[str, Any] = {"initial_skill": skill_file}
    flags = {"data": data, "backend": backend, "target.model": model, "target.base_url": base_url}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    overrides.update(parse_sets(assignments))
    config = build_config(config_file, overrides)
    store = open_store(db)
    result = evaluate_skill(config, split, store=store, run_id=run_id, on_progress=printer(quiet or as_json))
    if as_json:
        echo_json(result.summary)
    else:
        click.echo(summary_text(result.summary))
