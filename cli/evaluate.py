"""`skillstate eval`: score any skill file on a split, as a recorded run."""

from __future__ import annotations

from typing import Any

import click

from skillstate.cli.app import (
    EXIT_INTERRUPTED,
    Stopped,
    cli,
    db_option,
    echo_json,
    parse_sets,
    resume_hint,
    set_option,
)
from skillstate.cli.interrupts import caught_interrupts
from skillstate.cli.train import check_outputs, config_with_backend, json_events_option
from skillstate.errors import UserError
from skillstate.util import check_run_id


@cli.command("eval")
@click.option("--skill", "skill_file", type=click.Path(),
              help="The skill to score: markdown, an Agent Skills directory or archive (its SKILL.md), or a "
                   "skill bank (skillstate's or SkillRL's bank JSON: scored in mode bank).")
@click.option("--without-skill", is_flag=True,
              help="Score the target with no skill at all (a skill directory given with --skill still gives its "
                   "evals): what a skill adds is measured against this.")
@click.option("--split", default="test", show_default=True, help="train, val or test.")
@click.option("--data", type=click.Path(), help="Dataset directory (train/val/test .jsonl); default with "
                                                  "backend sim: the bundled simulated world.")
@click.option("--env", "env_name", help="The environment (default qa; e.g. sql, textworld_express).")
@click.option("--backend", type=click.Choice(["sim", "openai"]), help="LLM backend of the target.")
@click.option("--model", "--target-model", "model", help="The target model.")
@click.option("--base-url", help="OpenAI-compatible endpoint of the target.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML or TOML config file.")
@click.option("--samples", type=int, help="Samples per item (G > 1: distinct requests, seed 0..G-1, for GRPO "
                                          "groups; set target.temperature above 0).")
@set_option
@click.option("--run-id", help="Id of the evaluation run.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines or bar, only the results.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@json_events_option
@db_option
def evaluate(skill_file, without_skill, split, data, env_name, backend, model, base_url, config_file, samples,
             assignments, run_id, quiet, as_json, json_events, db) -> None:
    """Score a skill file on a split, with results per task type. The
    evaluation is recorded as a run of its own (kind eval), so it shows in
    `skillstate runs` and can be audited and verified like any run.

    \b
    Examples:
        skillstate export --best > best.md && skillstate eval --skill best.md
        skillstate export -o best.skill && skillstate eval --skill best.skill   # a trained skill directory
        skillstate eval --skill my_skill.md --split val --data examples/qa
        skillstate eval --skill my_skill.md --backend openai --model gpt-4o-mini --data examples/qa
        skillstate eval --skill agent.md --env sql --split val
        skillstate eval --skill examples/skills/meeting-notes --without-skill   # a skill's evals, no skill
    """
    from skillstate.cli.live import JsonEvents, reporter
    from skillstate.cli.render import summary_text
    from skillstate.engine.loading import new_run_id
    from skillstate.storage.store import open_store
    from skillstate.trainer import evaluate_skill

    check_outputs(as_json, json_events)
    if skill_file is None and not without_skill:
        raise UserError("eval needs a skill: pass --skill FILE (or --without-skill to score the target alone)")
    overrides: dict[str, Any] = {"initial_skill": skill_file} if skill_file is not None else {}
    flags = {"data": data, "env": env_name, "backend": backend, "target.model": model, "target.base_url": base_url,
             "samples": samples}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    sets = parse_sets(assignments)
    overrides.update(sets)
    if run_id is not None:
        check_run_id(run_id)
    text = _require_text(skill_file) if skill_file is not None and not without_skill else None
    if text is not None:  # a bank file (skillstate's or SkillRL's bank JSON) is scored in mode bank
        from skillstate.bank.skillrl_format import mode_for_skill_file
        from skillstate.config_sources import load_config_file

        explicit = sets.get("mode") or (load_config_file(config_file).get("mode") if config_file else None)
        overrides["mode"] = mode_for_skill_file(text, skill_file, explicit)
    config = config_with_backend(config_file, overrides, roles=("target", "judge"))
    store = open_store(db)
    events = JsonEvents(store) if json_events else None
    progress = reporter(quiet=quiet, as_json=as_json, events=events)
    run_id = run_id or new_run_id("eval")  # known here, so that Ctrl-C can name it
    try:
        with caught_interrupts(), progress:
            result = evaluate_skill(config, split, store=store, run_id=run_id, on_progress=progress,
                                    without_skill=without_skill)
    except KeyboardInterrupt:
        if store.get_run(run_id) is None:
            raise Stopped("interrupted before the evaluation run was created; nothing was written",
                          EXIT_INTERRUPTED) from None
        raise Stopped(f"interrupted; the evaluation run {run_id} is saved: finish it with: {resume_hint(run_id)}",
                      EXIT_INTERRUPTED) from None
    if events is not None:
        events.summary(result.run_id, result.summary)
    elif as_json:
        echo_json(result.summary)
    else:
        click.echo(summary_text(result.summary))


def _require_text(skill_file: str) -> str | None:
    """The skill file's text (None for a directory, an archive or a file that cannot be read: the library
    names the problem). An empty skill file is a mistake (a failed export, a wrong path), not a skill to score."""
    from skillstate.engine.skill_source import is_skill_tree_path

    if is_skill_tree_path(skill_file):
        return None
    try:
        from skillstate.input_files import read_input_text

        text = read_input_text(skill_file)
    except (OSError, UnicodeDecodeError):
        return None
    if not text.strip():
        raise UserError(f"skill file {skill_file} is empty; nothing to evaluate")
    return text
