"""`skillstate`: the command line. Thin: parse, call the library, print.

The commands live in the modules imported below (`train`, `evaluate`, `read`, `export_cmd`,
`policy_cmd`, ...); importing them registers them on the group.
"""

from __future__ import annotations

from skillstate.cli import (  # noqa: F401  (registers the commands)
    dashboard,
    evaluate,
    export_cmd,
    integrity,
    policy_cmd,
    read,
    review_cmd,
    skill_cmd,
    tools,
    train,
    visual,
)
from skillstate.cli.app import cli


def main() -> None:
    cli(prog_name="skillstate")


if __name__ == "__main__":  # pragma: no cover
    main()
