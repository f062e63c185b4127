"""The click group and the helpers every command shares."""

from __future__ import annotations

import json
from typing import Any

import click
from sqlalchemy.exc import SQLAlchemyError

from skillstate import __version__
from skillstate.config import parse_assignment, redact
from skillstate.errors import BudgetStop, ConcurrencyError, CorruptLogError, SkillstateError, UserError
from skillstate.store import DEFAULT_DB
from skillstate.util import parse_step


class CLIError(click.ClickException):
    """A user error: one line on stderr, exit code 2."""

    exit_code = 2


class BudgetStopped(click.ClickException):
    """The run reached its cost budget and stopped cleanly: exit code 3."""

    exit_code = 3


class Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except UserError as err:
            raise CLIError(str(err)) from None
        except BudgetStop as err:
            raise BudgetStopped(str(err)) from None
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


def budget_option(fn):
    return click.option("--max-cost-usd", type=click.FloatRange(min=0, min_open=True), metavar="USD",
                        help="Stop cleanly once the requests this run sent cost this much "
                             "(exit code 3; resume with a higher budget).")(fn)


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
