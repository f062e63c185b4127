"""The README's Python example runs, and every command it shows exists."""

from __future__ import annotations

import re
from pathlib import Path

from skillstate.cli.main import cli

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_python_api_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    assert blocks
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["result"].best_score >= namespace["result"].baseline_score
    assert namespace["fork"].state.parent_run_id == "api-demo"


def test_every_command_the_readme_shows_exists():
    lines = re.findall(r"(?m)^(?:\$ )?(?:[A-Z_]+=\S+ )*skillstate ([a-z][a-z-]+)", README)
    inline = re.findall(r"`skillstate ([a-z][a-z-]+)", README)
    shown = set(lines) | set(inline)
    assert shown, "the README shows no command"
    commands = set(cli.commands)
    missing = {name for name in shown if name not in commands and name not in {"db"}}
    assert not missing, missing
    assert "db" in commands and "upgrade" in cli.commands["db"].commands


def test_ci_runs_the_readme_commands_as_written():
    """.ci/run types the README's first commands exactly, so that a newcomer's
    `pip install -e ".[test]" && pytest` cannot break unnoticed again."""
    first = re.search(r"```bash\n(.*?)```", README, re.DOTALL)
    assert first is not None
    commands = [line.split("  #")[0].strip() for line in first.group(1).splitlines() if line.strip()]
    assert any(c.endswith("&& pytest") for c in commands) and any(c.endswith("skillstate run") for c in commands)
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    missing = [c for c in commands if c not in ci]
    assert not missing, missing
