"""`skillstate dashboard`: serve the read-only web view of a database."""

from __future__ import annotations

import errno
import socket

import click

from skillstate.cli.app import CLIError, cli, existing_db_option

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback serves every run to the network, "
                   "with no authentication.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port (0: any free port).")
@click.option("--review", "review", is_flag=True,
              help="Also decide reviews (review: accepted, new_best, all) on each waiting run's review page; the "
                   "decisions are recorded in the database, every other page stays read-only.")
@click.option("--reviewer", help="With --review: the name the review form starts with (default: "
                                 "$SKILLSTATE_REVIEWER, else your OS user name).")
@existing_db_option
def dashboard(host, port, review, reviewer, db) -> None:
    """Open a read-only web view of the runs in the database: learning curves,
    every step's patches, diffs and decisions, the skill with the provenance
    of each sentence, lineage and comparisons. It updates live while a run is
    in progress and never writes to the database, unless --review lets its
    review pages record decisions.

    \b
    Example:
        skillstate dashboard                # then open http://127.0.0.1:8765
        skillstate dashboard --db postgresql+psycopg://me@db.example/team
        skillstate dashboard --review       # decide the steps runs wait on
    """
    import asyncio

    try:
        import uvicorn

        from skillstate.dashboard.app import create_app
    except ImportError as err:
        from skillstate.util import install_hint

        raise CLIError(f"the dashboard needs its extra ({err.name} is missing): {install_hint('dashboard')}") from None
    from skillstate.dashboard.store_view import open_read_only

    if reviewer is not None and not review:
        raise CLIError("--reviewer goes with --review")
    desk = review_desk(db, reviewer) if review else None
    store = open_read_only(db)
    try:
        sock = listening_socket(host, port)
    except BaseException:
        store.close()
        if desk is not None:
            desk.store.close()
        raise
    local = host in LOOPBACK
    if not local:
        click.echo(f"warning: listening on {host}: there is no authentication, and anyone who can reach this "
                   "port can read every run in the database"
                   + (" and decide its reviews under any name" if desk is not None else ""), err=True)
    allowed = [*LOOPBACK, "[::1]"] if local else None
    app = create_app(store, allowed_hosts=allowed, review=desk)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    async def announce() -> None:  # after the socket is bound, so port 0 shows the real port
        while not server.started:
            await asyncio.sleep(0.02)
        for sock in server.servers[0].sockets if server.servers else []:
            bound = sock.getsockname()
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            mode = "review mode: its review pages record decisions" if desk is not None else "read-only"
            click.echo(f"dashboard of {store.display_url} at http://{shown}:{bound[1]}/ ({mode}; Ctrl-C stops it)")
            break

    async def main() -> None:
        await asyncio.gather(server.serve(sockets=[sock]), announce())

    try:
        asyncio.run(main())
    finally:
        sock.close()
        store.close()
        if desk is not None:
            desk.store.close()


def review_desk(db: str, reviewer: str | None):
    """--review: a store the review pages may append decisions to, and the name their form starts with."""
    from skillstate.dashboard.review_page import ReviewDesk
    from skillstate.engine.review_desk import reviewer_name
    from skillstate.storage.store import open_store

    name = reviewer_name(reviewer) if reviewer is not None else _default_reviewer()
    return ReviewDesk(open_store(db, create=False, write=True), reviewer=name)


def _default_reviewer() -> str:
    """The form's first name: $SKILLSTATE_REVIEWER or the OS user, when one can be had (else the form asks)."""
    from skillstate.engine.review_desk import reviewer_name
    from skillstate.errors import UserError

    try:
        return reviewer_name(None)
    except UserError:
        return ""


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket the dashboard serves on, bound here (as uvicorn would bind it) so that a port in use or
    an address this machine does not have is one line and exit 2, not uvicorn's traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port left in TIME_WAIT, not one in use
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        shown = f"[{host}]" if ":" in host else host
        hint = (" (another program is listening there: pick another --port, or --port 0 for any free one)"
                if err.errno == errno.EADDRINUSE else "")
        raise CLIError(f"cannot listen on {shown}:{port}: {err.strerror or err}{hint}") from None
    return sock
