"""The README's and the docs' commands: the Python API example runs, every command they show exists,
and .ci/run types the README's first commands as written."""

from __future__ import annotations

import re
from pathlib import Path

from skillstate.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYTHON_API = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
# Every page of the docs site (docs/hooks/ holds the build's code, not pages).
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
         for path in sorted((ROOT / "docs").rglob("*.md")) if "hooks" not in path.parts}


def test_python_api_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", PYTHON_API, re.DOTALL)
    assert blocks
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "docs/python-api.md", "exec"), namespace)
    assert namespace["result"].best_score >= namespace["result"].baseline_score
    assert namespace["fork"].state.parent_run_id == "api-demo"


def test_every_command_the_readme_and_the_docs_show_exists():
    commands = set(cli.commands)
    assert "db" in commands and "upgrade" in cli.commands["db"].commands
    assert len(PAGES) >= 20, sorted(PAGES)
    for name, text in {"README.md": README, **PAGES}.items():
        lines = re.findall(r"(?m)^(?:\$ )?(?:[A-Z_]+=\S+ )*skillstate ([a-z][a-z-]+)", text)
        inline = re.findall(r"`skillstate ([a-z][a-z-]+)", text)
        shown = set(lines) | set(inline)
        if name in ("README.md", "docs/walkthrough.md"):
            assert shown, f"{name} shows no command"
        missing = {cmd for cmd in shown if cmd not in commands}
        assert not missing, (name, missing)


def test_ci_runs_the_readme_commands_as_written():
    """.ci/run types the README's first commands exactly, so that a newcomer's
    `pip install -e ".[test]" && pytest` cannot break unnoticed again."""
    first = re.search(r"```bash\n(.*?)```", README, re.DOTALL)
    assert first is not None
    commands = [line.split("  #")[0].strip() for line in first.group(1).splitlines() if line.strip()]
    assert any(c.endswith("&& pytest") for c in commands) and any(c.endswith("skillstate run") for c in commands)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    missing = [c for c in commands if c not in ci]
    assert not missing, missing
