"""Start-up stays light: importing the CLI, `skillstate --help` and every
command's `--help` load none of the heavy libraries (the LLM client, the
database layer and its drivers, plotting, MLflow, Ray, torch and the
training stack, the web server). They are imported where they are used.
(Start-up time itself is measured in bench/, not here.)"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["openai", "anthropic", "sqlalchemy", "alembic", "psycopg", "matplotlib", "mlflow", "ray", "torch",
         "transformers", "trl", "peft", "datasets", "starlette", "uvicorn", "numpy", "pandas", "playwright"]

PROBE = """
import json, sys
from click.testing import CliRunner
from skillstate.cli.main import cli
args = json.loads(sys.argv[1])
if args is not None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def _loaded(args) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_heavy_library():
    assert _loaded(None) == []


def test_help_loads_no_heavy_library():
    assert _loaded(["--help"]) == []


def test_every_commands_help_loads_no_heavy_library():
    from skillstate.cli.main import cli

    names = []
    for name, command in cli.commands.items():
        names.append([name, "--help"])
        for sub in getattr(command, "commands", {}):
            names.append([name, sub, "--help"])
    probe = """
import json, sys
from click.testing import CliRunner
from skillstate.cli.main import cli
heavy = json.loads(sys.argv[2])
bad = {}
for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, (args, result.output)
    found = sorted(m for m in heavy if m in sys.modules)
    if found:
        bad[" ".join(args)] = found
        break
print(json.dumps(bad))
"""
    out = subprocess.run([sys.executable, "-c", probe, json.dumps(names), json.dumps(HEAVY)], capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}
