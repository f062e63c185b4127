"""Support commands: the database schema and the local sim server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from skillstate.cli.app import cli, db_option, echo_json
from skillstate.errors import UserError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@cli.command("sim-server")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--data", type=click.Path(), help="Serve this dataset's world instead of the bundled one.")
@click.option("--env", "env_name", default=None,
              help="The environment whose target the server plays (default qa; sql, textworld_express, ... with its "
                   "built-in tasks, or --data).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="Play the environment of this run config (its env, env_config, data, seed and episode keys).")
@click.option("--skill", "skill_dir", type=click.Path(), default=None,
              help="Play a skill's own evals: a skill directory holding evals/evals.json (env evals, split by the "
                   "config's seed); the server answers the target's and the judge's requests.")
@click.option("--latency", type=float, default=0.0, show_default=True, metavar="SECONDS",
              help="Hold each chat completion back this long, like a hosted model's round trip; concurrent requests "
                   "wait in parallel, never in a queue.")
def sim_server(port, data, env_name, config_file, skill_dir, latency) -> None:
    """Serve the simulated world over an OpenAI-compatible API on 127.0.0.1,
    to try --backend openai offline. Stop with Ctrl-C.

    \b
    Example:
        skillstate sim-server --port 8000 --latency 0.2 &
        OPENAI_API_KEY=local skillstate run --backend openai --model sim \\
            --base-url http://127.0.0.1:8000/v1 --data DIR
    """
    from skillstate.sim.server import SimServer

    if not 0 <= port <= 65535:
        raise UserError(f"--port must be 0 to 65535 (0 picks a free port), got {port}")
    if not 0 <= latency <= 3600:
        raise UserError(f"--latency must be 0 to 3600 seconds, got {latency}")
    world = sim_world_named(env_name, data, config_file, skill_dir)
    try:
        server = SimServer(world, port=port, latency=latency)
    except OSError as err:  # the port is taken, or not ours to bind
        raise UserError(f"cannot serve on 127.0.0.1:{port}: {err.strerror or err}"
                        + (" (pick another --port)" if port else "")) from None
    delay = f", {latency:g} s per reply" if latency else ""
    click.echo(f"serving the sim world at {server.base_url}{delay} (Ctrl-C to stop)")
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


def sim_world_named(env_name: str | None, data: str | None, config_file: str | None = None,
                    skill_dir: str | None = None):
    """The sim world of an environment, on its built-in tasks or a dataset
    directory; with a config file, the environment of that run config; with
    `skill_dir`, the evals of that skill (env evals)."""
    from skillstate.config import SkillConfig
    from skillstate.config_sources import load_config_file
    from skillstate.config_views import validate_config
    from skillstate.envs.registry import apply_settings, construct_env, env_settings, resolve_env
    from skillstate.sim.backend import sim_world_for
    from skillstate.sim.noise import SimNoise
    from skillstate.sim.world import SimWorld, bundled_splits

    config = validate_config(load_config_file(config_file)) if config_file is not None else SkillConfig()
    overrides = {k: v for k, v in (("env", env_name), ("data", data), ("initial_skill", skill_dir)) if v is not None}
    config = config.model_copy(update=overrides) if overrides else config
    from skillstate.engine.create import evals_env, skill_evals

    config = evals_env(config)
    names = [config.train_split, config.val_split, config.test_split]
    if config.env == "qa" and not config.data:
        return SimWorld([i for items in bundled_splits().values() for i in items], SimNoise.of(config.sim))
    cls = resolve_env(config.env)
    cls.check_requirements()
    settings = env_settings(cls, config.env_config, config.env)
    splits = cls.load_splits(config.data, names) if config.data else \
        skill_evals(config, settings, names) if getattr(cls, "uses_judge", False) else \
        cls.builtin_splits(settings, names)
    if splits is None:
        raise UserError(f"env {config.env!r} has no built-in tasks: pass --data DIR")
    env = construct_env(cls, splits, settings, config.env)
    apply_settings(env, config)
    return sim_world_for(env, config.sim)


@cli.group()
def db() -> None:
    """Database commands: the schema (Alembic migrations shipped in the package) and copying runs."""


@db.command("upgrade")
@db_option
def db_upgrade(db) -> None:
    """Create the schema or upgrade it to the latest revision.

    \b
    Example:
        skillstate db upgrade --db postgresql+psycopg://localhost/skills
    """
    from skillstate.storage.migrate import check_file_intact, current_revision, ensure_schema, head_revision

    with _engine(db, create=True) as engine:
        check_file_intact(engine)  # a damaged file is refused as `db check` finds it, never called up to date
        before = current_revision(engine)
        ensure_schema(engine)  # refuses someone else's database and a damaged schema, naming the damage
    head = head_revision()
    shown = engine.url.render_as_string(hide_password=True)
    if before == head:
        click.echo(f"{shown} is at the latest revision {head}")
    else:
        click.echo(f"{shown} upgraded from {before or 'empty'} to {head}")


@db.command("check")
@db_option
def db_check(db) -> None:
    """Check the schema without changing anything: exit 0 if it is fine, 2
    with one line naming the problem (someone else's database, a missing
    table or column, no version table, a file that is not a database).

    \b
    Example:
        skillstate db check --db sqlite:///skillstate.db
    """
    from skillstate.storage.migrate import SchemaError, file_problem, head_revision, inspect_schema

    with _engine(db, create=False) as engine:
        report = inspect_schema(engine)
        damage = report.problem or file_problem(engine)
    if damage:
        raise SchemaError(damage)
    if report.state == "empty":
        raise SchemaError(f"{report.url} is an empty database: it has no skillstate schema "
                          "(`skillstate db upgrade` creates it)")
    head = head_revision()
    later = "" if report.revision == head else f"; revision {head} is newer: `skillstate db upgrade` upgrades it"
    click.echo(f"{report.url}: the skillstate schema is fine (revision {report.revision}{later})")


@contextmanager
def _engine(url: str, *, create: bool) -> Iterator[Engine]:
    """An engine on `url` whose database errors (cannot connect, cannot create) are one line."""
    from sqlalchemy.exc import SQLAlchemyError

    from skillstate.storage.migrate import DatabaseProblem, db_reason
    from skillstate.storage.store import make_engine

    engine = make_engine(url, create=create)
    try:
        yield engine
    except SQLAlchemyError as err:  # the user's URL, server or file
        shown = engine.url.render_as_string(hide_password=True)
        raise DatabaseProblem(f"cannot use database {shown}: {db_reason(err)}") from None
    finally:
        engine.dispose()


@db.command("copy")
@click.option("--from", "source_url", required=True, metavar="URL", help="The database to copy from (only read).")
@click.option("--to", "dest_url", required=True, metavar="URL",
              help="The database to copy into (created or upgraded if needed).")
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def db_copy(source_url, dest_url, run_ids, as_json) -> None:
    """Copy runs (default: all) between databases, with their fork ancestors,
    every blob they name and their LLM calls, then audit each at the
    destination. Events are copied byte for byte, so the hash chain holds
    there, and a copied run resumes, forks and verifies without paying again.

    A run already there with the same log is left as it is; one whose log
    there is a prefix of this one (it grew since the last copy) gets the
    missing events; one with a different log is refused, and nothing is
    copied. Each run is written in one transaction. A run being driven at
    the source is copied up to its last committed event. Exit 2 for a refusal
    (one line, nothing written), 1 if a copied run does not audit there.

    \b
    Example:
        skillstate db copy --from sqlite:///skillstate.db \\
            --to postgresql+psycopg://me@db.team/skills my-run my-fork
    """
    from skillstate.exports.db_copy import copy_runs, runs_to_copy, same_database
    from skillstate.storage.store import open_store

    source = open_store(source_url, create=False, write=False)
    try:
        if same_database(source_url, dest_url):
            raise UserError(f"--from and --to name the same database ({source.display_url}); nothing to copy")
        runs_to_copy(source, list(run_ids) or None)  # an unknown run: refused before the destination is touched
        dest = open_store(dest_url)
        try:
            shown: list[str] = []

            def show(result) -> None:  # the header once the copy is under way: a refusal stays one line
                if not shown:
                    click.echo(f"copying from {source.display_url} to {dest.display_url}")
                    shown.append(result.run_id)
                _copy_line(result)

            report = copy_runs(source, dest, list(run_ids) or None, on_run=None if as_json else show)
        finally:
            dest.close()
    finally:
        source.close()
    if as_json:
        echo_json(report.to_json())
    else:
        totals, n = report.totals(), len(report.runs)
        rate = (f" ({totals['events_copied'] / report.seconds:,.0f} events/s)"
                if report.seconds > 0 and totals["events_copied"] else "")
        click.echo(f"{n} run{'s' if n != 1 else ''}: {totals['events_copied']} events, {totals['blobs_copied']} "
                   f"blobs and {totals['calls_copied']} calls copied in {report.seconds:.2f} s{rate}")
    bad = [r for r in report.runs if r.audit_ok is False]
    if bad:
        raise click.ClickException(f"run {bad[0].run_id} does not audit at the destination: "
                                   f"{bad[0].audit_problems[0]}")


def _copy_line(result) -> None:
    what = {"copied": f"copied {result.events_copied} events",
            "appended": f"appended {result.events_copied} events (now {result.events})",
            "already there": f"already there ({result.events} events)"}[result.status]
    notes = [f"{result.blobs_copied} blobs, {result.calls_copied} calls"]
    if result.ancestor:
        notes.append("a fork ancestor")
    if result.driven:
        notes.append("being driven at the source: up to its last committed event")
    verdict = "audit ok" if result.audit_ok else "AUDIT FAILED" if result.audit_ok is False else "not audited"
    click.echo(f"  {result.run_id}: {what}; {'; '.join(notes)}; {verdict} ({result.seconds:.2f} s)")
