"""Support commands: the database schema and the local sim server."""

from __future__ import annotations

import click

from skillstate.errors import UserError

from skillstate.cli.app import cli, db_option


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
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from skillstate.config import redact
    from skillstate.migrate import current_revision, ensure_schema, head_revision
    from skillstate.store import make_engine

    engine = make_engine(db)
    shown = make_url(db).render_as_string(hide_password=True)
    try:
        before = current_revision(engine)
        ensure_schema(engine)
    except SQLAlchemyError as err:  # cannot connect, cannot create: the user's URL or server
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise UserError(f"cannot upgrade {shown}: {redact(reason)}") from None
    finally:
        engine.dispose()
    head = head_revision()
    if before == head:
        click.echo(f"{shown} is at the latest revision {head}")
    else:
        click.echo(f"{shown} upgraded from {before or 'empty'} to {head}")
