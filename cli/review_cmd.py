"""`skillstate review`: read the step a run waits on, and decide it (`review`)."""

from __future__ import annotations

import click

from skillstate.cli.app import cli, command_hint, db_option, echo_json, resume_hint
from skillstate.errors import UserError


def parse_drops(values: tuple[str, ...]) -> list[int]:
    """`--drop 2 --drop 3` or `--drop 2,3`: edit numbers as listed (from 1), as indices (from 0)."""
    out: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part.isdigit() or int(part) < 1:
                raise UserError(f"--drop takes the numbers of edits as `skillstate review` lists them (1, 2, ...), "
                                f"got {part!r}")
            out.append(int(part) - 1)
    return out


@cli.command()
@click.argument("run_id")
@click.option("--step", "step", metavar="N", help="The step you read: a decision is refused when the run waits "
                                                   "on another. Without a decision: show step N's review.")
@click.option("--approve", "decision", flag_value="approve",
              help="Keep the gate's verdict (with --drop: keep the candidate without those edits).")
@click.option("--reject", "decision", flag_value="reject", help="Keep the current skill: the candidate is not kept.")
@click.option("--drop", "drops", multiple=True, metavar="N",
              help="With --approve: leave edit N out (as numbered in the review; repeatable, or 2,3).")
@click.option("--comment", default="", help="A comment recorded with the decision.")
@click.option("--reviewer", help="Your name (default: $SKILLSTATE_REVIEWER, else your OS user name).")
@click.option("--json", "as_json", is_flag=True, help="Print the review (or the recorded decision) as JSON.")
@db_option
def review(run_id, step, decision, drops, comment, reviewer, as_json, db) -> None:
    """Read the step RUN waits on (review: accepted, new_best or all), and
    decide it: the diff per file, the scores and the gate's verdict, each
    edit with the analysts and failures behind it, and what it cost.

    The decision is recorded in the run's log (ReviewDecided: who, when,
    what, the comment); then `skillstate resume RUN` goes on. A run that
    waits on nothing, or on another step than --step, is refused and
    nothing is recorded.

    \b
    Examples:
        skillstate review my-run                       # read it
        skillstate review my-run --approve --step 3
        skillstate review my-run --approve --drop 2 --comment "edit 2 is too broad"
        skillstate review my-run --reject --reviewer alice
    """
    from skillstate.storage.store import open_store
    from skillstate.util import parse_step

    number = parse_step(step) if step is not None else None
    dropped = parse_drops(drops)
    if decision is None:
        unused = [flag for flag, given in (("--drop", drops), ("--comment", comment), ("--reviewer", reviewer))
                  if given]
        if unused:
            raise UserError(f"{unused[0]} goes with a decision: add --approve or --reject")
        show(open_store(db, create=False), run_id, number, as_json)
        return
    if dropped and decision != "approve":
        raise UserError("--drop leaves edits out of an approved candidate: use it with --approve")
    from skillstate.engine.review_desk import decide

    store = open_store(db, create=False, write=True)
    stored = decide(store, run_id, decision, step=number, dropped=dropped, comment=comment, reviewer=reviewer)
    event = stored.event
    from skillstate.log.events_review import ReviewDecided

    assert isinstance(event, ReviewDecided)  # what decide appends
    if as_json:
        echo_json({"run_id": stored.run_id, "seq": stored.seq, **event.model_dump(mode="json")})
        return
    from skillstate.reading.review import review_line

    click.echo(f"recorded: {review_line(event)} (event {stored.seq} of run {stored.run_id})")
    click.echo(f"go on with: {resume_hint(stored.run_id)}")


def show(store, run_id: str, step: int | None, as_json: bool) -> None:
    from skillstate.reading.review import review_view

    view = review_view(store, run_id, step)
    if as_json:
        echo_json(view)
        return
    from skillstate.cli.review_view import review_text

    click.echo(review_text(view))
    if view["waiting"]:
        hint = command_hint("review", view["run_id"], f" --step {view['step']}")
        drop = " [--drop N ...]" if view["droppable"] else ""
        click.echo(f"\ndecide with: {hint} --approve{drop} [--comment TEXT]   or   {hint} --reject")
