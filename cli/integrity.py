"""`skillstate head`: the hash of a run's last event, to keep elsewhere."""

from __future__ import annotations

import click

from skillstate.cli.app import cli, echo_json
from skillstate.cli.app import existing_db_option as db_option


@cli.command()
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
def head(run_id, as_json, db) -> None:
    """Print SEQ:HASH of a run's last event (default: the latest run).

    The hash covers the whole chain before it. Record it outside the
    database; `skillstate audit RUN --head SEQ:HASH` later fails if the log
    was cut or its past rewritten since.

    \b
    Example:
        skillstate head my-run > my-run.head
    """
    from skillstate.reading.audit import head as run_head
    from skillstate.storage.store import open_store

    h = run_head(open_store(db, create=False), run_id)
    if as_json:
        echo_json({"run_id": h.run_id, "seq": h.seq, "hash": h.hash})
    else:
        click.echo(str(h))
