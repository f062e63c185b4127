"""`skillstate`: the command line. Thin: parse, call the library, print."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from skillstate import __version__
from skillstate.config import build_config, parse_assignment
from sqlalchemy.exc import SQLAlchemyError

from skillstate.config import redact
from skillstate.errors import ConcurrencyError, CorruptLogError, SkillstateError, UserError
from skillstate.store import DEFAULT_DB, open_store
from skillstate.util import parse_step

from skillstate.cli.render import ProgressPrinter, event_summary, fmt, run_rows, summary_text


class CLIError(click.ClickException):
    """A user error: one line on stderr, exit code 2."""

    exit_code = 2


class Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except UserError as err:
            raise CLIError(str(err)) from None
        except (ConcurrencyError, CorruptLogError) as err:
            raise click.ClickException(f"{err} (run `skillstate audit` for details)"
                                       if isinstance(err, CorruptLogError) else str(err)) from None
        except SkillstateError as err:
            raise click.ClickException(f"{type(err).__name__}: {err}") from None
        except SQLAlchemyError as err:
            first = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
            raise click.ClickException(f"database error: {redact(first)}") from None


def db_option(fn):
    return click.option("--db", "db", envvar="SKILLSTATE_DB", default=DEFAULT_DB, show_default=True,
                        metavar="URL", help="Database URL (also $SKILLSTATE_DB).")(fn)


def set_option(fn):
    return click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                        help="Set any config key, e.g. --set gate_metric=mixed (repeatable).")(fn)


def parse_sets(assignments: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for text in assignments:
        key, value = parse_assignment(text)
        out[key] = value
    return out


def step_arg(value: str | None) -> int | None:
    return None if value is None else parse_step(value)


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="skillstate")
def cli() -> None:
    """Optimize the skill document of a frozen LLM agent (SkillOpt), with every
    run stored as an event log you can replay, fork and audit.

    \b
    Quick start (offline, simulated LLMs):
        skillstate run
        skillstate replay --to-step 3
        skillstate fork step_2 --lr linear
        skillstate audit
    """


# --- run ---------------------------------------------------------------------


@cli.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="YAML or TOML config file.")
@click.option("--backend", type=click.Choice(["sim", "openai"]), help="LLM backend for both roles.")
@click.option("--data", type=click.Path(), help="Dataset directory (train/val/test .jsonl).")
@click.option("--model", help="Model for both roles.")
@click.option("--optimizer-model", help="Model of the optimizer (reflect, merge, rank).")
@click.option("--target-model", help="Model of the target agent.")
@click.option("--base-url", help="OpenAI-compatible endpoint for both roles.")
@click.option("--run-id", help="Run id; an existing id resumes that run.")
@click.option("--epochs", type=int, help="num_epochs.")
@click.option("--batch-size", type=int, help="batch_size.")
@click.option("--edit-budget", type=int, help="edit_budget (max edits per step).")
@click.option("--lr", type=click.Choice(["constant", "linear", "cosine"]), help="lr_scheduler of the edit budget.")
@set_option
@click.option("--quiet", "-q", is_flag=True, help="No progress lines, only the summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@db_option
def run(config_file, backend, data, model, optimizer_model, target_model, base_url, run_id, epochs, batch_size,
        edit_budget, lr, assignments, quiet, as_json, db) -> None:
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
    """
    from skillstate.engine.runner import load_run
    from skillstate.trainer import Trainer

    overrides: dict[str, Any] = {}
    flags = {"backend": backend, "data": data, "num_epochs": epochs, "batch_size": batch_size,
             "edit_budget": edit_budget, "lr_scheduler": lr}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    for role in ("target", "optimizer"):
        if model:
            overrides[f"{role}.model"] = model
        if base_url:
            overrides[f"{role}.base_url"] = base_url
    if optimizer_model:
        overrides["optimizer.model"] = optimizer_model
    if target_model:
        overrides["target.model"] = target_model
    overrides.update(parse_sets(assignments))

    store = open_store(db)
    existing = run_id is not None and store.get_run(run_id) is not None
    base = dict(load_run(store, run_id).state.config) if existing else None
    config = build_config(config_file, overrides, base=base)
    trainer = Trainer(config, store=store, run_id=run_id, on_progress=None if quiet or as_json else ProgressPrinter())
    rid = trainer.prepare()
    if not (quiet or as_json):
        verb = "resuming" if existing else "started"
        click.echo(f"{verb} run {rid} in {store.display_url}")
    train_and_report(trainer, as_json)


def train_and_report(trainer, as_json: bool = False) -> None:
    """Train (or resume) and print the summary; Ctrl-C leaves a resumable run."""
    try:
        result = trainer.train()
    except KeyboardInterrupt:
        raise click.ClickException(
            f"interrupted; resume with: skillstate run --run-id {trainer.run_id}") from None
    if as_json:
        echo_json(result.summary)
    else:
        click.echo("")
        click.echo(summary_text(result.summary))


@cli.command()
@click.argument("run_id", required=False)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines, only the summary.")
@db_option
def resume(run_id, quiet, db) -> None:
    """Continue a run where its log ends (default: the latest run).

    \b
    Example:
        skillstate resume run-20261121-101500-ab12
    """
    from skillstate.trainer import Trainer

    store = open_store(db)
    row = store.require_run(run_id)
    train_and_report(Trainer(store=store, run_id=row.run_id, on_progress=None if quiet else ProgressPrinter()))


# --- reading runs ------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def runs(as_json, db) -> None:
    """List the runs in the database.

    \b
    Example:
        skillstate runs --json
    """
    store = open_store(db)
    rows = run_rows(store, store.list_runs())
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no runs yet; start one with: skillstate run")
        return
    click.echo(f"{'run':32} {'parent':>28} {'status':>14} {'baseline':>9} {'best':>7} {'at':>4}")
    for r in rows:
        parent = f"{r['parent_run_id']}@{r['fork_step']}" if r["parent_run_id"] else ""
        click.echo(f"{r['run_id']:32} {parent:>28} {r['status']:>14} {fmt(r['baseline_score']):>9} "
                   f"{fmt(r['best_score']):>7} {r['best_step']:>4}")


def _step_of(stored) -> int | None:
    payload = json.loads(stored.payload)
    return payload.get("step")


@cli.command()
@click.argument("run_id", required=False)
@click.option("--step", help="Only the events of this step (5 or step_5).")
@click.option("--lineage", is_flag=True, help="For a fork, start with the parent's events it inherits.")
@click.option("--json", "as_json", is_flag=True, help="Print the events as a JSON array.")
@db_option
def log(run_id, step, lineage, as_json, db) -> None:
    """Show the event stream of a run: its own events, or with --lineage
    also the parent prefix a fork inherits.

    \b
    Examples:
        skillstate log
        skillstate log my-run --step 3 --json
    """
    from skillstate.engine.runner import load_run

    store = open_store(db)
    loaded = load_run(store, run_id)
    wanted = step_arg(step)
    source = loaded.lineage if lineage else loaded.own
    events = [s for s in source if wanted is None or _step_of(s) == wanted]
    if wanted is not None and not events:
        raise UserError(f"run {loaded.run_id!r} has no events for step {wanted}")
    if as_json:
        echo_json([{"run_id": s.run_id, "seq": s.seq, "type": s.type, "version": s.version, "hash": s.hash,
                    "prev_hash": s.prev_hash, "created_at": s.created_at, "payload": json.loads(s.payload)}
                   for s in events])
        return
    for s in events:
        st = _step_of(s)
        who = f"{s.run_id}:" if lineage else ""
        click.echo(f"{who}{s.seq:>5}  {s.type:18} {'' if st is None else 'step ' + str(st):>8}  "
                   f"{event_summary(s.event)}")


@cli.command()
@click.argument("run_id", required=False)
@click.option("--step", help="Show this step in detail (5 or step_5).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def show(run_id, step, as_json, db) -> None:
    """Summarize a run, or one step of it: batch, patches, kept edits with
    their apply status, scores and the gate's decision.

    \b
    Examples:
        skillstate show
        skillstate show --step 4
    """
    from skillstate.engine.runner import load_run
    from skillstate.history import run_summary
    from skillstate.cli.steps import step_detail

    store = open_store(db)
    loaded = load_run(store, run_id)
    if step is None:
        summary = run_summary(store, loaded)
        if as_json:
            echo_json(summary)
        else:
            click.echo(summary_text(summary))
            click.echo("")
            click.echo("step  epoch  budget  decision      candidate  current  best")
            for rec in loaded.state.history:
                click.echo(f"{rec.step:>4}  {rec.epoch:>5}  {rec.edit_budget:>6}  {rec.decision:12}  "
                           f"{fmt(rec.candidate_score):>9}  {fmt(rec.current_score):>7}  {fmt(rec.best_score):>5}")
        return
    detail = step_detail(store, loaded, parse_step(step))
    if as_json:
        echo_json(detail)
    else:
        from skillstate.cli.steps import step_text

        click.echo(step_text(detail))


@cli.command()
@click.argument("run_id", required=False)
@click.option("--to-step", help="Fold the log up to the end of this step (0 = baseline).")
@click.option("--verify", is_flag=True, help="Re-execute the run against its recorded LLM responses.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def replay(run_id, to_step, verify, as_json, db) -> None:
    """Rebuild the state after a step from the log, with no LLM call; or,
    with --verify, re-run the engine's logic on the recorded responses and
    check it produces the same events.

    \b
    Examples:
        skillstate replay --to-step 7
        skillstate replay my-run --to-step step_0 --json
        skillstate replay --verify
    """
    store = open_store(db)
    if verify == (to_step is not None):
        raise UserError("replay needs exactly one of --to-step N or --verify")
    if verify:
        from skillstate.audit import verify as run_verify

        report = run_verify(store, run_id)
        if as_json:
            echo_json({"run_id": report.run_id, "ok": report.ok, "checked": report.checked, "total": report.total,
                       "divergence": report.divergence, "seq": report.seq})
        elif report.ok:
            click.echo(f"run {report.run_id}: re-execution reproduces all {report.total} events")
        if not report.ok:
            raise click.ClickException(f"run {report.run_id}: diverges at event {report.seq}: {report.divergence}")
        return
    from skillstate.history import replay as run_replay

    snap = run_replay(store, run_id, parse_step(to_step))
    if as_json:
        echo_json(snap.to_json())
        return
    s, rec = snap.state, snap.record
    click.echo(f"run {snap.run_id} after step {snap.step} (of {s.total_steps})")
    if rec:
        click.echo(f"decision: {rec.decision} ({rec.reason}), budget {rec.edit_budget}, epoch {rec.epoch}")
    else:
        click.echo("decision: baseline")
    click.echo(f"current score {fmt(s.current_score)}, best score {fmt(s.best_score)} at step {s.best_step}")
    click.echo(f"accepted {s.count('accept', 'accept_best')}, rejected {s.count('reject')}, skipped {s.count('skip')}")
    click.echo("\n--- current skill ---")
    click.echo(snap.current_skill.rstrip("\n"))
    if snap.best_skill != snap.current_skill:
        click.echo("\n--- best skill ---")
        click.echo(snap.best_skill.rstrip("\n"))


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="[RUN] STEP")
@click.option("--lr", type=click.Choice(["constant", "linear", "cosine"]), help="New lr_scheduler.")
@click.option("--edit-budget", type=int, help="New edit_budget.")
@click.option("--epochs", type=int, help="New num_epochs.")
@set_option
@click.option("--run-id", "new_run_id", help="Id of the new run.")
@click.option("--no-run", is_flag=True, help="Create the fork but do not train it yet.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines, only the summary.")
@db_option
def fork(args, lr, edit_budget, epochs, assignments, new_run_id, no_run, quiet, db) -> None:
    """Start a new run from a run's state after STEP, with other settings.

    The fork records its parent and fork step and does not copy the
    parent's events; LLM requests identical to earlier ones are served from
    the log, so the shared part is never paid twice.

    \b
    Examples:
        skillstate fork step_5 --lr linear
        skillstate fork my-run 5 --edit-budget 2 --set gate_metric=mixed --run-id my-run-b
    """
    from skillstate.engine.runner import fork_run
    from skillstate.trainer import Trainer

    if len(args) > 2:
        raise UserError("fork takes [RUN] STEP")
    run_id, step = (None, args[0]) if len(args) == 1 else args
    overrides = {k: v for k, v in {"lr_scheduler": lr, "edit_budget": edit_budget, "num_epochs": epochs}.items()
                 if v is not None}
    overrides.update(parse_sets(assignments))
    store = open_store(db)
    parent = store.require_run(run_id).run_id
    child = fork_run(store, parent, parse_step(step), overrides, new_run_id)
    click.echo(f"forked {child} from {parent} at step {parse_step(step)}")
    if no_run:
        return
    train_and_report(Trainer(store=store, run_id=child, on_progress=None if quiet else ProgressPrinter()))


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="[RUN] TEXT")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def why(args, as_json, db) -> None:
    """Explain why TEXT is in the skill: the step that added it, the kept
    edit, the analysts that proposed it and the failures they saw.

    \b
    Examples:
        skillstate why "order of operations"
        skillstate why my-run "single word"
        skillstate why -- "- Keep answers short."   # text that starts with -
    """
    from skillstate.provenance import explain

    if len(args) > 2:
        raise UserError('why takes [RUN] TEXT (quote the text: skillstate why "some words")')
    run_id, text = (None, args[0]) if len(args) == 1 else args
    info = explain(open_store(db), run_id, text)
    if as_json:
        echo_json(info)
        return
    from skillstate.cli.render import why_text

    click.echo(why_text(info))


@cli.command()
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def audit(run_id, as_json, db) -> None:
    """Check a run's log: hash chain, contiguous sequence, known event types,
    blobs, a fold without error and, for a fork, its parent's prefix.

    Exits 0 when the log is intact, 1 naming the first bad event otherwise.

    \b
    Example:
        skillstate audit my-run
    """
    from skillstate.audit import audit as run_audit

    report = run_audit(open_store(db), run_id)
    if as_json:
        echo_json({"run_id": report.run_id, "ok": report.ok, "events": report.events, "problems": report.problems})
    elif report.ok:
        click.echo(f"run {report.run_id}: {report.events} events, hash chain and invariants intact")
    if not report.ok:
        raise click.ClickException(report.problems[0])


@cli.command()
@click.argument("run_id", required=False)
@click.option("--step", help="The skill after this step (default: the end of the run).")
@click.option("--best", is_flag=True, help="The best skill rather than the current one.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write to FILE.")
@db_option
def export(run_id, step, best, output, db) -> None:
    """Print (or write) a skill as markdown. Default: the run's best skill.

    \b
    Examples:
        skillstate export -o skill.md
        skillstate export my-run --step 3
    """
    from skillstate.history import skill_at

    _, text = skill_at(open_store(db), run_id, step_arg(step), best=best)
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot write {output}: {err.strerror or err}") from None
    else:
        click.echo(text, nl=not text.endswith("\n"))


@cli.command()
@click.argument("args", nargs=-1, required=True, metavar="[RUN] STEP_A STEP_B")
@db_option
def diff(args, db) -> None:
    """Unified diff of the current skill between two steps.

    \b
    Example:
        skillstate diff 0 4
    """
    from skillstate.history import skill_diff

    if len(args) not in (2, 3):
        raise UserError("diff takes [RUN] STEP_A STEP_B")
    run_id, a, b = (None, *args) if len(args) == 2 else args
    _, text = skill_diff(open_store(db), run_id, parse_step(a), parse_step(b))
    click.echo(text or "(no difference)", nl=not text.endswith("\n"))


@cli.command("sim-server")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--data", type=click.Path(), help="Serve this dataset's world instead of the bundled one.")
def sim_server(port, data) -> None:
    """Serve the simulated world over an OpenAI-compatible API on 127.0.0.1,
    to try --backend openai offline. Stop with Ctrl-C.

    \b
    Example:
        skillstate sim-server --port 8000 &
        OPENAI_API_KEY=local skillstate run --backend openai --model sim \\
            --base-url http://127.0.0.1:8000/v1 --data DIR
    """
    from skillstate.envs import load_dataset_dir
    from skillstate.sim.server import SimServer
    from skillstate.sim.world import SimWorld, bundled_splits

    splits = load_dataset_dir(data, ["train", "val", "test"]) if data else bundled_splits()
    server = SimServer(SimWorld([i for items in splits.values() for i in items]), port=port)
    click.echo(f"serving the sim world at {server.base_url} (Ctrl-C to stop)")
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


# --- database ---------------------------------------------------------------------


@cli.group()
def db() -> None:
    """Database schema commands (Alembic migrations shipped in the package)."""


@db.command("upgrade")
@db_option
def db_upgrade(db) -> None:
    """Create the schema or upgrade it to the latest revision.

    \b
    Example:
        skillstate db upgrade --db postgresql+psycopg://localhost/skills
    """
    from skillstate.migrate import current_revision, ensure_schema, head_revision

    from skillstate.store import make_engine

    engine = make_engine(db)
    try:
        before = current_revision(engine)
        ensure_schema(engine)
    except Exception as err:  # connection problems are user errors here
        if isinstance(err, UserError):
            raise
        raise UserError(f"cannot upgrade {_display(db)}: {str(err).splitlines()[0]}") from None
    finally:
        engine.dispose()
    head = head_revision()
    if before == head:
        click.echo(f"{_display(db)} is at the latest revision {head}")
    else:
        click.echo(f"{_display(db)} upgraded from {before or 'empty'} to {head}")


def _display(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def main() -> None:
    cli(prog_name="skillstate")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
