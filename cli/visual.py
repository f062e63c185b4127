"""Commands that draw or export a run for others: plot, export-mlflow.

matplotlib and mlflow are imported by the library functions when a command runs, never at import:
`skillstate --help` loads neither."""

from __future__ import annotations

import click

from skillstate.cli.app import cli, echo_json
from skillstate.cli.app import existing_db_option as db_option


@cli.command()
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The figure file; its suffix picks the format: .png, .pdf or .svg.")
@click.option("--x", "x_axis", type=click.Choice(["step", "cost"]), default="step", show_default=True,
              help="The x axis: the step, or the cumulative cost in USD (score against budget).")
@click.option("--no-bars", is_flag=True, help="Leave out the per-task-type test bars (panel b).")
@click.option("--title", help="A title above the figure.")
@click.option("--dpi", type=click.IntRange(20, 2400), default=200, show_default=True,
              help="Resolution of a .png.")
@db_option
def plot(run_ids, output, x_axis, no_bars, title, dpi, db) -> None:
    """Draw the learning curves of one run, or of several overlaid, and the
    test score per task type of the baseline against the best skill.

    Panel (a): the candidate's validation score per step, marked by the
    gate's decision (accepted, new best, rejected, rejected early at its
    bound, skipped), the current and the best score, the baseline, and the
    best skill's test score. A fork's inherited steps are faded. Panel (b):
    the final test report by task type. Needs the plots extra.

    A policy training run (sft, grpo) is drawn as its training curves
    instead: the loss, for GRPO the mean reward, and the policy's val score
    at each validation (evolutions of the bank marked). Policy runs and
    skill runs are not drawn in one figure.

    \b
    Examples:
        skillstate plot -o curves.png
        skillstate plot my-run my-run-fork -o curves.pdf --title "linear vs cosine"
        skillstate plot my-run --x cost --no-bars -o budget.svg
    """
    from skillstate.exports.plots import plot_to_file
    from skillstate.storage.store import open_store

    info = plot_to_file(open_store(db, create=False), list(run_ids), output, x=x_axis, bars=not no_bars,
                        title=title, dpi=dpi)
    size = f"{info['pixels'][0]}x{info['pixels'][1]} px, " if info["pixels"] else ""
    runs = ", ".join(info["runs"])
    click.echo(f"wrote {info['path']} ({size}{info['bytes'] // 1024 or 1} KB): {runs}")


@cli.command("export-mlflow")
@click.argument("run_id", required=False)
@click.option("--tracking-uri", envvar="MLFLOW_TRACKING_URI", default="sqlite:///mlflow.db", show_default=True,
              metavar="URI", help="MLflow tracking URI (also $MLFLOW_TRACKING_URI); the default is MLflow's own, a "
                                  "SQLite file here, with the artifacts in mlruns/ beside it.")
@click.option("--experiment", default="skillstate", show_default=True, help="MLflow experiment name.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@db_option
def export_mlflow(run_id, tracking_uri, experiment, as_json, db) -> None:
    """Log a run to MLflow: its config as params, its scores, edit budget and
    cost per step as metrics (a skill-bank run: its bank size, validation
    rate per category and retrieval hit rate instead of the edit budget), the
    test reports, and each accepted skill and the best one as artifacts (a
    bank as .json). A fork becomes a nested run of its parent's
    (exported first). Exporting again never duplicates a run: it appends the
    steps logged since, or does nothing. Needs the mlflow extra.

    A policy training run (sft, grpo) logs every metric TRL logged at its
    step (train/loss, train/reward, ...), each validation (val/gate,
    val/by_task_type.CATEGORY), each evolution of the bank, the base model's
    identity and the trainer's settings as params, and its checkpoints'
    paths and hashes as checkpoints.json (the weights are not uploaded).

    \b
    Examples:
        skillstate export-mlflow
        skillstate export-mlflow my-run --tracking-uri sqlite:///mlflow.db --experiment paper
        mlflow ui --backend-store-uri sqlite:///mlflow.db
    """
    from skillstate.exports.mlflow_export import export_run
    from skillstate.storage.store import open_store

    result = export_run(open_store(db, create=False), run_id, tracking_uri=tracking_uri, experiment=experiment)
    if as_json:
        echo_json(result)
        return
    for run in result["runs"]:
        where = f"MLflow run {run['mlflow_run_id']}"
        if run["action"] == "unchanged":
            click.echo(f"run {run['run_id']}: already exported ({where})")
        else:
            verb = "exported to" if run["action"] == "created" else "updated"
            new = "" if run["action"] == "created" else "new "
            steps = f"{run['steps_logged']} {new}step{'s' if run['steps_logged'] != 1 else ''}"
            click.echo(f"run {run['run_id']}: {verb} {where} ({steps}, {run['artifacts_logged']} artifacts)")
    click.echo(f"experiment {result['experiment']!r} at {result['tracking_uri']}")
