"""Commands that read runs back, with no LLM call: runs, log, show, replay,
why, audit, diff (the exports are in `export_cmd`)."""

from __future__ import annotations

import json

import click

from skillstate.cli.app import cli, echo_json, step_arg
from skillstate.cli.app import existing_db_option as db_option
from skillstate.errors import UserError
from skillstate.util import is_step, parse_step

# Each command imports the store, the engine and the renderers it uses when it
# runs: `skillstate --help` loads none of them.


def positional(args: tuple[str, ...]) -> tuple[str, ...]:
    """Arguments of a command that lets `-1` through as a (bad) step: refuse real unknown options."""
    for arg in args:
        if arg.startswith("-") and not arg[1:].isdigit():
            raise UserError(f"no such option: {arg} (see --help)")
    return args


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def runs(as_json, db) -> None:
    """List the runs in the database.

    \b
    Example:
        skillstate runs --json
    """
    from skillstate.cli.runs_view import run_rows, runs_lines
    from skillstate.storage.store import open_store

    store = open_store(db, create=False)
    rows = run_rows(store, store.list_runs())
    if as_json:
        echo_json(rows)
    elif not rows:
        click.echo("no runs yet; start one with: skillstate run")
    else:
        click.echo("\n".join(runs_lines(rows)))
    damaged = [r for r in rows if r["status"] == "damaged"]
    if damaged:  # every run is listed, and the damage is not silent: exit 1, as audit does
        more = f" (and {len(damaged) - 1} more damaged)" if len(damaged) > 1 else ""
        raise click.ClickException(f"{damaged[0]['problem']}{more} (run `skillstate audit` for details)")


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
    from skillstate.cli.log_view import log_lines
    from skillstate.engine.loading import load_run
    from skillstate.storage.store import open_store

    store = open_store(db, create=False)
    loaded = load_run(store, run_id)
    wanted = step_arg(step)
    source = loaded.lineage if lineage else loaded.own
    events = [s for s in source if wanted is None or s.step == wanted]
    if wanted is not None and not events:
        raise UserError(f"run {loaded.run_id!r} has no events for step {wanted}")
    if as_json:
        echo_json([{"run_id": s.run_id, "seq": s.seq, "type": s.type, "version": s.version, "hash": s.hash,
                    "prev_hash": s.prev_hash, "created_at": s.created_at, "payload": json.loads(s.payload)}
                   for s in events])
        return
    click.echo("\n".join(log_lines(events, lineage)))


@cli.command()
@click.argument("run_id", required=False)
@click.option("--step", help="Show this step in detail (5 or step_5).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def show(run_id, step, as_json, db) -> None:
    """Summarize a run, or one step of it: batch, patches, kept edits with
    their apply status, scores and the gate's decision. Step 0 is the
    baseline (and, for a bank seeded from trajectories, the seeding).

    \b
    Examples:
        skillstate show
        skillstate show --step 4
    """
    from skillstate.cli.render import history_lines, summary_text
    from skillstate.engine.loading import load_run
    from skillstate.reading.history import run_summary
    from skillstate.storage.store import open_store

    store = open_store(db, create=False)
    loaded = load_run(store, run_id)
    if step is None:
        summary = run_summary(store, loaded)
        if as_json:
            echo_json(summary)
        else:
            click.echo(summary_text(summary))
            if summary.get("kind") != "eval":  # an evaluation run has no steps
                labels = None
                if loaded.state.config.get("mode") == "bank":  # what each step did to the bank
                    from skillstate.reading.bank_steps import step_labels

                    labels = step_labels(e.event for e in loaded.lineage)
                from skillstate.reading.history import early_rejects

                click.echo("")
                click.echo("\n".join(history_lines(loaded.state.history, labels=labels,
                                                    bounds=early_rejects(loaded))))
            if loaded.state.config.get("mode") == "bank" and loaded.state.best_skill:
                from skillstate.bank.document import read_bank
                from skillstate.cli.render import bank_lines

                click.echo("")
                click.echo("\n".join(bank_lines(read_bank(store.get_blob(loaded.state.best_skill)))))
        return
    number = parse_step(step)
    if number == 0:  # the baseline (and a bank's seeding): no step events
        from skillstate.cli.step_zero_view import step_zero_text
        from skillstate.reading.step_zero import step_zero

        zero = step_zero(store, loaded)
        if as_json:
            echo_json(zero)
        else:
            click.echo(step_zero_text(zero))
        return
    from skillstate.reading.step_detail import step_detail  # (its imports cost a summary 0.1 s)

    detail = step_detail(store, loaded, number)
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
    if verify == (to_step is not None):
        raise UserError("replay needs exactly one of --to-step N or --verify")
    from skillstate.storage.store import open_store

    store = open_store(db, create=False)
    if verify:
        from skillstate.reading.audit import verify as run_verify

        report = run_verify(store, run_id)
        if as_json:
            echo_json({"run_id": report.run_id, "ok": report.ok, "checked": report.checked, "total": report.total,
                       "divergence": report.divergence, "seq": report.seq, "note": report.note})
        elif report.ok and report.note:
            click.echo(f"run {report.run_id}: all {report.total} events check ({report.note})")
        elif report.ok:
            click.echo(f"run {report.run_id}: re-execution reproduces all {report.total} events")
        if not report.ok:
            raise click.ClickException(f"run {report.run_id}: diverges at event {report.seq}: {report.divergence}")
        return
    from skillstate.cli.render import fmt
    from skillstate.reading.history import replay as run_replay

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
@click.argument("args", nargs=-1, required=True, metavar="[RUN] TEXT")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def why(args, as_json, db) -> None:
    """Explain why TEXT is in the skill: the step that added it, the kept
    edit, the analysts that proposed it and the failures they saw. TEXT
    that is in no skill the run had is a user error: one line, exit 2
    (with --json, the JSON says "found": false first).

    \b
    Examples:
        skillstate why "order of operations"
        skillstate why my-run "single word"
        skillstate why -- "- Keep answers short."   # text that starts with -
    """
    from skillstate.reading.provenance import explain
    from skillstate.storage.store import open_store

    if len(args) > 2:
        raise UserError('why takes [RUN] TEXT (quote the text: skillstate why "some words")')
    run_id, text = (None, args[0]) if len(args) == 1 else args
    store = open_store(db, create=False)
    from skillstate.reading.bank_provenance import bank_why_text, explain_bank, is_bank_run

    if is_bank_run(store, run_id):  # mode bank: which skills hold the text, and where each came from
        bank_info = explain_bank(store, run_id, text)
        if as_json:
            echo_json(bank_info)
        elif bank_info["found"]:
            click.echo(bank_why_text(bank_info))
        if not bank_info["found"]:
            raise UserError(f"no skill of run {bank_info['run_id']}'s bank matches {text!r}")
        return
    info = explain(store, run_id, text)
    missing = f"{info['text']!r} is not in the best skill of run {info['run_id']} (nor in any skill it had)"
    if info.get("in_files"):
        missing = (f"{info['text']!r} is not in the SKILL.md run {info['run_id']} trains, but in "
                   f"{', '.join(info['in_files'])}, which the run keeps as read from the skill directory")
    if as_json:
        echo_json(info)
    elif info["found"]:
        from skillstate.cli.render import why_text

        click.echo(why_text(info))
    if not info["found"]:
        raise UserError(missing)  # a text the run never had: a user error, as an unknown run or step is (exit 2)


@cli.command()
@click.argument("run_id", required=False)
@click.option("--head", "expect_head", metavar="SEQ:HASH",
              help="A head recorded earlier with `skillstate head`: the log must still hold it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def audit(run_id, expect_head, as_json, db) -> None:
    """Check a run's log: hash chain, contiguous sequence, known event types,
    blobs, a fold without error and, for a fork, its parent's prefix.

    With $SKILLSTATE_AUDIT_KEY set, every event must also carry a valid
    signature under that key (runs written with the key set are signed), so
    a re-hashed chain is caught. With --head, a cut tail is caught too.
    Exits 0 when the log is intact, 1 naming the first bad event otherwise.

    \b
    Examples:
        skillstate audit my-run
        skillstate audit my-run --head "$(cat my-run.head)"
    """
    from skillstate.reading.audit import audit as run_audit
    from skillstate.storage.store import open_store

    report = run_audit(open_store(db, create=False), run_id, expect_head=expect_head)
    checks = "hash chain and invariants" + (", signatures" if report.keyed else "") + (
        ", recorded head" if report.head_checked else "")
    if as_json:
        echo_json({"run_id": report.run_id, "ok": report.ok, "events": report.events, "problems": report.problems,
                   "keyed": report.keyed, "head_checked": report.head_checked})
    elif report.ok:
        click.echo(f"run {report.run_id}: {report.events} events, {checks} intact")
    if not report.ok:
        raise click.ClickException(report.problems[0])


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, required=True, metavar="[RUN] STEP_A STEP_B")
@db_option
def diff(args, db) -> None:
    """Unified diff of the current skill between two steps.

    \b
    Example:
        skillstate diff 0 4
    """
    from skillstate.reading.history import skill_diff
    from skillstate.storage.store import open_store

    if len(positional(args)) not in (2, 3):
        raise UserError("diff takes [RUN] STEP_A STEP_B")
    if len(args) == 2 and not is_step(args[0]) and is_step(args[1]):
        raise UserError(f"diff needs two steps: got run {args[0]!r} and one step {args[1]!r}; "
                        f"e.g. skillstate diff {args[0]} 0 {args[1]}")
    run_id, a, b = (None, *args) if len(args) == 2 else args
    steps = parse_step(a), parse_step(b)
    store = open_store(db, create=False)
    from skillstate.engine.loading import load_run

    loaded = load_run(store, run_id)
    if loaded.state.config.get("mode") == "bank":  # a bank: skills added, dropped, refined; not a JSON line diff
        from skillstate.bank.document import read_bank
        from skillstate.cli.bank_view import bank_diff_lines
        from skillstate.reading.bank_diff import bank_diff
        from skillstate.reading.history import chosen_skill

        banks = [read_bank(store.get_blob(chosen_skill(loaded, s))) for s in steps]
        labels = [f"{loaded.run_id}@step_{s}" for s in steps]
        click.echo("\n".join(bank_diff_lines(bank_diff(*banks), *labels)))
        return
    _, text = skill_diff(store, loaded.run_id, *steps)
    click.echo(text or "(no difference)", nl=not text.endswith("\n"))
