"""Commands that train: run, resume, fork."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from skillstate.cli.app import (
    EXIT_INTERRUPTED,
    CLIError,
    Stopped,
    budget_option,
    cli,
    db_option,
    echo_json,
    parse_sets,
    resume_hint,
    set_option,
)
from skillstate.cli.interrupts import caught_interrupts
from skillstate.cli.read import positional
from skillstate.errors import UserError
from skillstate.util import check_run_id, parse_step

if TYPE_CHECKING:
    from skillstate.cli.live import JsonEvents, LiveProgress, Plain
    from skillstate.config import SkillConfig


def json_events_option(fn):
    return click.option("--json-events", "json_events", is_flag=True,
                        help="Write each event appended as one JSON object a line on stdout, then a summary "
                             "line (not with --json).")(fn)


def check_outputs(as_json: bool, json_events: bool) -> None:
    if as_json and json_events:
        raise CLIError("--json and --json-events cannot be combined: pick one")


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML or TOML config file.")
@click.option("--backend", type=click.Choice(["sim", "openai"]), help="LLM backend for both roles.")
@click.option("--data", type=click.Path(), help="Dataset directory (train/val/test .jsonl).")
@click.option("--env", "env_name", help="The environment: qa (default), sql, textworld_express, scienceworld, an "
                                        "installed name or python:MODULE:CLASS.")
@click.option("--model", help="Model for both roles.")
@click.option("--optimizer-model", help="Model of the optimizer (reflect, merge, rank).")
@click.option("--target-model", help="Model of the target agent.")
@click.option("--base-url", help="OpenAI-compatible endpoint for both roles.")
@click.option("--run-id", help="Run id; an existing id resumes that run.")
@click.option("--epochs", type=int, help="num_epochs.")
@click.option("--batch-size", type=int, help="batch_size.")
@click.option("--edit-budget", type=int, help="edit_budget (max edits per step).")
@click.option("--lr", type=click.Choice(["constant", "linear", "cosine"]), help="lr_scheduler of the edit budget.")
@click.option("--mode", type=click.Choice(["skill", "bank"]),
              help="skill: one skill document (SkillOpt, the default); bank: a bank of skills (SkillRL).")
@set_option
@budget_option
@click.option("--quiet", "-q", is_flag=True, help="No progress lines or bar, only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@json_events_option
@db_option
def run(config_file, backend, data, env_name, model, optimizer_model, target_model, base_url, run_id, epochs,
        batch_size, edit_budget, lr, mode, assignments, max_cost_usd, quiet, as_json, json_events, db) -> None:
    """Train a skill: baseline, then rollout, reflect, aggregate, select,
    update and gate for every step; test at the end.

    With backend sim and no data, it runs the bundled simulated world
    offline. Running again with an existing --run-id resumes that run where
    its log ends; LLM calls already made are served from the log.

    \b
    Examples:
        skillstate run
        skillstate run --epochs 2 --lr linear --set gate_metric=mixed
        skillstate run --backend openai --model gpt-4o-mini --data examples/qa
        skillstate run --run-id my-run          # resume after a crash
        skillstate run --set use_slow_update=true --set use_meta_skill=true
        skillstate run --max-cost-usd 2.50      # stop cleanly once $2.50 is spent
        skillstate run --env sql                # a tool-using agent over a bundled database
        skillstate run --env textworld_express  # a text-world agent (pip install "skillstate[textworlds]")
        skillstate run --mode bank              # a SkillRL skill bank, retrieved per task
    """
    from skillstate.cli.live import JsonEvents, reporter
    from skillstate.engine.runner import load_run
    from skillstate.storage.store import open_store
    from skillstate.trainer import Trainer

    check_outputs(as_json, json_events)
    overrides: dict[str, Any] = {}
    flags = {"backend": backend, "data": data, "env": env_name, "num_epochs": epochs, "batch_size": batch_size,
             "edit_budget": edit_budget, "lr_scheduler": lr, "max_cost_usd": max_cost_usd, "mode": mode}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    for role in ("target", "optimizer"):  # an empty value is passed on, for the config to refuse
        if model is not None:
            overrides[f"{role}.model"] = model
        if base_url is not None:
            overrides[f"{role}.base_url"] = base_url
    if optimizer_model is not None:
        overrides["optimizer.model"] = optimizer_model
    if target_model is not None:
        overrides["target.model"] = target_model
    overrides.update(parse_sets(assignments))

    if run_id is not None:
        check_run_id(run_id)  # (a run made before ids were checked resumes with `skillstate resume ID`)
    store = open_store(db) if run_id is not None else None  # else: after the config is known to be valid
    existing = store is not None and store.get_run(run_id) is not None
    state = load_run(store, run_id).state if existing and store is not None else None
    if state is not None and state.kind == "eval":
        raise UserError(f"run {run_id!r} is an evaluation run (skillstate eval), not a training run; "
                        "pick another --run-id")
    base = dict(state.config) if state is not None else None
    config = config_with_backend(config_file, overrides, base=base, run_id=run_id)
    store = store or open_store(db)
    events = JsonEvents(store, after=store.last_seq(run_id) if existing and run_id else 0) if json_events else None
    progress = reporter(quiet=quiet, as_json=as_json, events=events)
    trainer = Trainer(config, store=store, run_id=run_id, on_progress=progress)
    rid = trainer.prepare()
    if not (quiet or as_json or json_events):
        verb = "resuming" if existing else "started"
        click.echo(f"{verb} run {rid} in {store.display_url}")
    if not existing:
        show_plan(store, rid, config)
    train_and_report(trainer, as_json, progress, events)


def show_plan(store, run_id: str, config: SkillConfig) -> None:
    """Before a new run on a real endpoint: its steps, calls and rough cost (on
    stderr, so --json output stays clean)."""
    if config.backend == "sim":
        return
    from skillstate.reading.plan import plan_of

    click.echo(f"{plan_of(store, run_id).describe()}; stop at a budget with --max-cost-usd", err=True)


def sim_names() -> frozenset[str]:
    """The model names the sim backend answers to (skillstate.sim.server.SIM_MODEL_IDS and the defaults)."""
    from skillstate.config import SIM_MODELS

    return frozenset({"sim", "sim-model", *SIM_MODELS.values()})


def config_with_backend(config_file: str | None, overrides: dict[str, Any], *, base: dict[str, Any] | None = None,
                        run_id: str | None = None, roles: tuple[str, ...] = ("target", "optimizer", "judge"),
                        hint: str = "--backend openai") -> SkillConfig:
    """The config, never running the simulator under a real model's name: a
    model other than the sim names, or a base URL, with no backend chosen (by
    flag, --set, the config file or the run being resumed) means backend
    openai; with backend sim chosen, it is refused."""
    from skillstate.config_sources import build_config, load_config_file

    config = build_config(config_file, overrides, base=base)
    models = dict.fromkeys(getattr(config, role).model for role in roles)
    urls = dict.fromkeys(getattr(config, role).base_url for role in roles)
    real = [f"model {m!r}" for m in models if m and m not in sim_names()] + [f"base URL {u}" for u in urls if u]
    if config.backend != "sim" or not real:
        return config
    chosen = "backend" in overrides or base is not None or bool(
        config_file and "backend" in load_config_file(config_file))
    if not chosen:
        return build_config(config_file, {**overrides, "backend": "openai"}, base=base)
    who = f"run {run_id!r} uses backend sim" if base is not None else "backend sim was chosen"
    raise UserError(f"{who}: the offline simulator cannot call {' or '.join(real[:2])}; "
                    f"use {hint} for a real model")


def train_and_report(trainer, as_json: bool = False, progress: LiveProgress | Plain | None = None,
                     events: JsonEvents | None = None) -> None:
    """Train (or resume) inside the progress display and print the summary;
    Ctrl-C leaves a resumable run."""
    from contextlib import nullcontext

    from skillstate.cli.render import summary_text

    try:
        with caught_interrupts(), progress if progress is not None else nullcontext():
            result = trainer.train()
    except KeyboardInterrupt:
        raise Stopped(f"interrupted; the run is saved: resume with: {resume_hint(trainer.run_id)}",
                      EXIT_INTERRUPTED) from None
    if events is not None:
        events.summary(result.run_id, result.summary)
    elif as_json:
        echo_json(result.summary)
    else:
        click.echo("")
        click.echo(summary_text(result.summary))
    stop = result.state.stopped
    if stop is not None:
        relax = "delete the stop file, then:" if stop.condition == "stop_file" else "relax it:"
        key = {"no_improvement": "stop_after_no_improvement", "target_score": "target_score",
               "wall_time": "max_wall_seconds"}.get(stop.condition)
        hint = resume_hint(trainer.run_id, f" --set {key}=..." if key else "")
        click.echo(f"the run stopped cleanly ({stop.condition}) and is saved; to go on, {relax} {hint}", err=True)


@cli.command()
@click.argument("run_id", required=False)
@budget_option
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="Change a runtime key, such as a stop condition: --set target_score=0.9 (repeatable).")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines or bar, only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@json_events_option
@db_option
def resume(run_id, max_cost_usd, assignments, quiet, as_json, json_events, db) -> None:
    """Continue a run where its log ends (default: the latest training run).

    Only runtime keys may change (the budget, concurrency, retries, the
    endpoint, the stop conditions); fork the run to change anything else.

    \b
    Examples:
        skillstate resume run-20261121-101500-ab12
        skillstate resume --max-cost-usd 5     # after a stop at the cost budget
        skillstate resume --set stop_after_no_improvement=6   # after a stop condition
    """
    from skillstate.cli.live import JsonEvents, reporter
    from skillstate.config_sources import build_config
    from skillstate.engine.runner import load_run
    from skillstate.storage.store import open_store
    from skillstate.trainer import Trainer

    check_outputs(as_json, json_events)
    store = open_store(db, create=False, write=True)
    row = store.require_run(run_id)
    config = None
    overrides = parse_sets(assignments)
    if max_cost_usd is not None:
        overrides["max_cost_usd"] = max_cost_usd
    if overrides:
        config = build_config(None, overrides, base=dict(load_run(store, row.run_id).state.config))
    events = JsonEvents(store, after=store.last_seq(row.run_id)) if json_events else None
    progress = reporter(quiet=quiet, as_json=as_json, events=events)
    train_and_report(Trainer(config, store=store, run_id=row.run_id, on_progress=progress), as_json, progress, events)


@cli.command(context_settings={"ignore_unknown_options": True})  # so that `fork demo -1` is a bad step
@click.argument("args", nargs=-1, required=True, metavar="[RUN] STEP")
@click.option("--lr", type=click.Choice(["constant", "linear", "cosine"]), help="New lr_scheduler.")
@click.option("--edit-budget", type=int, help="New edit_budget.")
@click.option("--epochs", type=int, help="New num_epochs.")
@set_option
@budget_option
@click.option("--run-id", "new_run_id", help="Id of the new run.")
@click.option("--no-run", is_flag=True, help="Create the fork but do not train it yet.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines or bar, only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (with the new run_id) as JSON.")
@json_events_option
@db_option
def fork(args, lr, edit_budget, epochs, assignments, max_cost_usd, new_run_id, no_run, quiet, as_json, json_events,
         db) -> None:
    """Start a new run from a run's state after STEP, with other settings.

    The fork records its parent and fork step and does not copy the
    parent's events; LLM requests identical to earlier ones are served from
    the log, so the shared part is never paid twice.

    \b
    Examples:
        skillstate fork step_5 --lr linear
        skillstate fork my-run 5 --edit-budget 2 --set gate_metric=mixed --run-id my-run-b
        skillstate fork step_6 --set update_mode=rewrite
    """
    from skillstate.cli.live import JsonEvents, reporter
    from skillstate.engine.runner import fork_run
    from skillstate.storage.store import open_store
    from skillstate.trainer import Trainer

    check_outputs(as_json, json_events)
    if len(positional(args)) > 2:
        raise UserError("fork takes [RUN] STEP")
    run_id, step = (None, args[0]) if len(args) == 1 else args
    step = parse_step(step)
    if new_run_id is not None:
        check_run_id(new_run_id)
    flags = {"lr_scheduler": lr, "edit_budget": edit_budget, "num_epochs": epochs, "max_cost_usd": max_cost_usd}
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(parse_sets(assignments))
    store = open_store(db, create=False, write=True)
    parent = store.require_run(run_id).run_id
    if any(key.split(".")[-1] in ("model", "base_url") for key in overrides):  # the parent's backend stays
        from skillstate.engine.runner import load_run

        config_with_backend(None, overrides, base=dict(load_run(store, parent).state.config), run_id=parent,
                            hint="--set backend=openai")
    child = fork_run(store, parent, step, overrides, new_run_id, probe=not no_run)
    if not (as_json or json_events):
        click.echo(f"forked {child} from {parent} at step {step}")
    events = JsonEvents(store) if json_events else None
    if no_run:
        if as_json or events is not None:
            from skillstate.engine.runner import load_run
            from skillstate.reading.history import run_summary

            summary = run_summary(store, load_run(store, child))
            if events is not None:
                events.summary(child, summary)
            else:
                echo_json(summary)
        return
    progress = reporter(quiet=quiet, as_json=as_json, events=events)
    train_and_report(Trainer(store=store, run_id=child, on_progress=progress), as_json, progress, events)
