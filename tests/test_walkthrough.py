"""The walkthrough is real output: every `$ skillstate …` command in the text
blocks of docs/walkthrough.md runs, in order, in a new directory, and prints
what the page shows. The README's short walkthrough is the same run: each
command of its bash block is one of the page's, and each output it shows is
what that command printed.

A line `...` stands for any number of lines. A few figures depend on how the
work done ahead raced the gate (how many sent calls went unused, what was
paid); on those lines, listed in VARIES, digits may differ. When the output
changes on purpose, `SKILLSTATE_WALKTHROUGH=FILE pytest
tests/test_walkthrough.py` writes what the commands printed to FILE, to copy
into docs/walkthrough.md.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from click.testing import CliRunner

from skillstate.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "walkthrough.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
VARIES = (re.compile(r"^\d+ sent calls? went unused"), re.compile(r"^paid \(sent\)"))


def section(text: str, heading: str) -> str:
    """The part of a markdown text under `heading` (a whole heading line), up to the next heading."""
    part = text.split(f"\n{heading}\n", 1)[1] if not text.startswith(f"{heading}\n") else text[len(heading):]
    return re.split(r"\n#{2,3} ", part, maxsplit=1)[0]  # (a `# ...` line in a text block is output)


def text_blocks(text: str) -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"```text\n(.*?)```", text, re.DOTALL)]


def walkthrough_blocks() -> list[list[str]]:
    """The text blocks of the walkthrough page's first section (before "Progress while it runs")."""
    return text_blocks(section(PAGE, "# Walkthrough: run, replay, fork, audit"))


FRESH_DIR = ["cd", "$(mktemp -d)"]  # how the walkthrough starts: a new, empty directory (its own database)


def readme_walkthrough() -> tuple[list[list[str]], list[list[str]]]:
    """The README's short walkthrough: (argv of each line of its bash blocks after the first, which must move to a
    new directory, its text blocks)."""
    part = section(README, "## A short walkthrough")
    lines = [line for block in re.findall(r"```bash\n(.*?)```", part, re.DOTALL) for line in block.splitlines()]
    argvs = [shlex.split(line, comments=True) for line in lines if line.strip()]
    assert argvs and argvs[0] == FRESH_DIR, f"the README's walkthrough must start in a new directory: {argvs[0]}"
    assert all(argv[0] == "skillstate" for argv in argvs[1:]), argvs
    return [argv[1:] for argv in argvs[1:]], text_blocks(part)


def test_the_walkthrough_starts_in_a_new_directory():
    """Issue 41, item 5: typed after the README's first `skillstate run`, in the same directory, the walkthrough
    printed other figures (its run served from the call table, `runs` with a row more). Both the page and the
    README start it in a directory of its own, and what they show is what a fresh database gives."""
    bash = re.findall(r"```bash\n(.*?)```", section(PAGE, "# Walkthrough: run, replay, fork, audit"), re.DOTALL)
    assert bash and shlex.split(bash[0].splitlines()[0], comments=True) == FRESH_DIR
    readme_walkthrough()


def commands(block: list[str]) -> list[tuple[list[str], list[str]]]:
    """(argv after `skillstate`, the lines shown under it), in order."""
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


def test_the_walkthrough_prints_what_the_docs_show(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"COLUMNS": "100", "NO_COLOR": None, "SKILLSTATE_AUDIT_KEY": None})
    blocks = walkthrough_blocks()
    assert len(blocks) >= 5
    transcript, failures = [], []
    printed: dict[tuple[str, ...], list[str]] = {}
    for block in blocks:
        for argv, want in commands(block):
            res = runner.invoke(cli, argv, catch_exceptions=False)
            got = [line.rstrip() for line in res.output.rstrip("\n").splitlines()]
            printed[tuple(argv)] = got
            transcript += ["$ skillstate " + shlex.join(argv), *got]
            if res.exit_code != 0:
                failures.append(f"skillstate {shlex.join(argv)} exited {res.exit_code}")
            elif not matches([line.rstrip() for line in want], got):
                failures.append(f"skillstate {shlex.join(argv)} printed:\n" + "\n".join(got))
    if os.environ.get("SKILLSTATE_WALKTHROUGH"):
        Path(os.environ["SKILLSTATE_WALKTHROUGH"]).write_text("\n".join(transcript) + "\n", encoding="utf-8")

    # the README's short walkthrough: the same commands, and what it shows of them is what they printed
    readme_argvs, readme_blocks = readme_walkthrough()
    failures += [f"README: skillstate {shlex.join(argv)} is not a command of docs/walkthrough.md"
                 for argv in readme_argvs if tuple(argv) not in printed]
    assert readme_blocks
    for block in readme_blocks:
        for argv, want in commands(block):
            if tuple(argv) not in printed:
                failures.append(f"README: skillstate {shlex.join(argv)} is not a command of docs/walkthrough.md")
            elif not matches([line.rstrip() for line in want], printed[tuple(argv)]):
                failures.append(f"README: skillstate {shlex.join(argv)} printed:\n" + "\n".join(printed[tuple(argv)]))
    assert not failures, "\n\n".join(failures)


def test_the_matcher():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "...", "b"], ["a", "b"])
    assert not matches(["a", "...", "d"], ["a", "b", "c"])
    assert not matches(["a"], ["a", "b"])
    assert matches(["58 sent calls went unused (x)"], ["61 sent calls went unused (x)"])
    assert not matches(["best (step 6)  0.967"], ["best (step 8)  0.967"])
