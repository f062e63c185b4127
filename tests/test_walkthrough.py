"""The README's walkthrough is real output: every `$ skillstate …` command in
its text blocks runs, in order, in a new directory, and prints what the
README shows.

A line `...` in the README stands for any number of lines. A few figures
depend on how the work done ahead raced the gate (how many sent calls went
unused, what was paid); on those lines, listed in VARIES, digits may differ.
When the output changes on purpose, `SKILLSTATE_WALKTHROUGH=FILE pytest
tests/test_walkthrough.py` writes what the commands printed to FILE, to copy
into the README.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from skillstate.cli.main import cli

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
VARIES = (re.compile(r"^\d+ sent calls? went unused"), re.compile(r"^paid \(sent\)"))


def walkthrough_blocks() -> list[list[str]]:
    """The text blocks of the README's walkthrough section, as lists of lines."""
    section = README.split("\n## Walkthrough", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    return [block.splitlines() for block in re.findall(r"```text\n(.*?)```", section, re.DOTALL)]


def commands(block: list[str]) -> list[tuple[list[str], list[str]]]:
    """(argv after `skillstate`, the lines the README shows under it), in order."""
    out: list[tuple[list[str], list[str]]] = []
    for line in block:
        if line.startswith("$ "):
            argv = shlex.split(line[2:], comments=True)
            assert argv[0] == "skillstate", line
            out.append((argv[1:], []))
        else:
            assert out, f"output before any command: {line!r}"
            out[-1][1].append(line)
    return out


def _same(want: str, got: str) -> bool:
    if any(p.search(want) for p in VARIES):
        return re.sub(r"\d", "0", want) == re.sub(r"\d", "0", got)
    return want == got


def matches(want: list[str], got: list[str]) -> bool:
    """`got` is `want`, where a `...` line stands for any run of lines."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and _same(want[0], got[0]) and matches(want[1:], got[1:])


def test_the_walkthrough_prints_what_the_readme_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"COLUMNS": "100", "NO_COLOR": None, "SKILLSTATE_AUDIT_KEY": None})
    blocks = walkthrough_blocks()
    assert len(blocks) >= 5
    transcript, failures = [], []
    for block in blocks:
        for argv, want in commands(block):
            res = runner.invoke(cli, argv, catch_exceptions=False)
            got = [line.rstrip() for line in res.output.rstrip("\n").splitlines()]
            transcript += ["$ skillstate " + shlex.join(argv), *got]
            if res.exit_code != 0:
                failures.append(f"skillstate {shlex.join(argv)} exited {res.exit_code}")
            elif not matches([line.rstrip() for line in want], got):
                failures.append(f"skillstate {shlex.join(argv)} printed:\n" + "\n".join(got))
    if os.environ.get("SKILLSTATE_WALKTHROUGH"):
        Path(os.environ["SKILLSTATE_WALKTHROUGH"]).write_text("\n".join(transcript) + "\n", encoding="utf-8")
    assert not failures, "\n\n".join(failures)


def test_the_matcher():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "...", "b"], ["a", "b"])
    assert not matches(["a", "...", "d"], ["a", "b", "c"])
    assert not matches(["a"], ["a", "b"])
    assert matches(["58 sent calls went unused (x)"], ["61 sent calls went unused (x)"])
    assert not matches(["best (step 6)  0.967"], ["best (step 8)  0.967"])
