"""The click group and the helpers every command shares.

The command modules import only click and light skillstate modules at the
top: SQLAlchemy, pydantic, rich and the engine are imported by the commands
that use them, so that `--help` and argument errors answer at once.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import click

from skillstate import __version__
from skillstate.errors import (
    BudgetStop,
    ConcurrencyError,
    CorruptLogError,
    LLMStop,
    ReviewPending,
    RunBusyError,
    RunStopped,
    SkillstateError,
    UserError,
    clip,
)
from skillstate.util import DEFAULT_DB, parse_step, redact


class CLIError(click.ClickException):
    """A user error: one line on stderr, exit code 2."""

    exit_code = 2


class Stopped(click.ClickException):
    """A run stopped cleanly and is resumable; the exit code says why."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        object.__setattr__(self, "exit_code", exit_code)  # this stop's own code; click declares a ClassVar


# Exit codes: 2 bad input or a fatal endpoint error, 3 the cost budget, 4 the LLM calls kept failing,
# 5 a step awaits review, 130 interrupted, 1 anything else (a database that refused a write, a damaged log, a bug).
EXIT_BUDGET, EXIT_LLM, EXIT_REVIEW, EXIT_INTERRUPTED = 3, 4, 5, 130
DB_META_KEY = "skillstate.db"


def resume_hint(run_id: str, extra: str = "") -> str:
    """The command that continues `run_id`, with --db when it is not the default."""
    return command_hint("resume", run_id, extra)


def command_hint(command: str, run_id: str, extra: str = "") -> str:
    """`skillstate COMMAND RUN`, with --db when it is not the default."""
    ctx = click.get_current_context(silent=True)
    db = ctx.meta.get(DB_META_KEY) if ctx is not None else None
    flag = ""
    if db and db != DEFAULT_DB:
        from sqlalchemy.engine import make_url

        flag = f" --db {shlex.quote(make_url(db).render_as_string(hide_password=True))}"
    return f"skillstate {command} {run_id}{extra}{flag}"


def stopped(err: RunStopped) -> Stopped:
    if isinstance(err, ReviewPending):
        return Stopped(f"{err}; the run is saved: read and decide the step with: {command_hint('review', err.run_id)}"
                       f", then go on with: {resume_hint(err.run_id)}", EXIT_REVIEW)
    if isinstance(err, BudgetStop):
        return Stopped(f"{err}; the run stopped cleanly and is saved: resume it with a higher budget: "
                       f"{resume_hint(err.run_id, ' --max-cost-usd AMOUNT')}", EXIT_BUDGET)
    code = 2 if isinstance(err, LLMStop) and err.fatal else EXIT_LLM if isinstance(err, LLMStop) else 1
    return Stopped(f"{err}; the run is saved: fix this, then resume with: {resume_hint(err.run_id)}", code)


class Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke(ctx)
        except click.ClickException as err:  # every error line, click's own too: long echoed input is cut, and
            # the run's keys (an endpoint may quote them) and URL credentials are masked
            object.__setattr__(err, "message", clip(redact(err.message)))  # (click declares it Final)
            raise

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except (UserError, RunBusyError) as err:
            raise CLIError(str(err)) from None
        except RunStopped as err:
            raise stopped(err) from None
        except (ConcurrencyError, CorruptLogError) as err:
            raise click.ClickException(f"{err} (run `skillstate audit` for details)"
                                       if isinstance(err, CorruptLogError) else str(err)) from None
        except SkillstateError as err:
            raise click.ClickException(f"{type(err).__name__}: {err}") from None
        except Exception as err:
            if not _is_database_error(err):
                raise
            from skillstate.config import redact

            first = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
            raise click.ClickException(f"database error: {redact(first)}") from None


def _is_database_error(err: Exception) -> bool:
    """A SQLAlchemyError (if SQLAlchemy was never imported, it cannot be one)."""
    exc = sys.modules.get("sqlalchemy.exc")
    return exc is not None and isinstance(err, exc.SQLAlchemyError)


def _remember_db(ctx: click.Context, _param: click.Parameter, value: str) -> str:
    ctx.meta[DB_META_KEY] = value  # for resume hints
    return value


def _existing_db(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from skillstate.storage.store import make_engine

    make_engine(value, create=False).dispose()  # a bad URL or a missing file: one line, nothing created
    return _remember_db(ctx, param, value)


def db_option(fn):
    """--db of a command that may create the database."""
    return click.option("--db", "db", envvar="SKILLSTATE_DB", default=DEFAULT_DB, show_default=True,
                        metavar="URL", callback=_remember_db, help="Database URL (also $SKILLSTATE_DB).")(fn)


def existing_db_option(fn):
    """--db of a command that only reads: a database that does not exist is refused, never created."""
    return click.option("--db", "db", envvar="SKILLSTATE_DB", default=DEFAULT_DB, show_default=True,
                        metavar="URL", callback=_existing_db, help="Database URL (also $SKILLSTATE_DB).")(fn)


def set_option(fn):
    return click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                        help="Set any config key, e.g. --set gate_metric=mixed (repeatable).")(fn)


def budget_option(fn):
    return click.option("--max-cost-usd", type=click.FloatRange(min=0, min_open=True), metavar="USD",
                        help="Stop cleanly once the requests this run sent cost this much "
                             "(exit code 3; resume with a higher budget).")(fn)


def parse_sets(assignments: tuple[str, ...]) -> dict[str, Any]:
    from skillstate.config_sources import parse_assignment

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
