"""What the CLI prints fits the terminal: every line of `runs`, `show`, the run
summary, `eval`, `log` and `show --step N` is at most $COLUMNS wide, long ids
and errors are cut with an ellipsis instead of wrapping (off a terminal without
$COLUMNS nothing is cut), and output that is not a terminal holds no escape
sequence."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from conftest import scripted_factory, small_config
from rich.cells import cell_len

from skillstate.cli.main import cli
from skillstate.cli.render import summary_text
from skillstate.cli.tables import Col, table_lines
from skillstate.trainer import Trainer

LONG = "a-run-id-long-enough-to-need-cutting-in-every-table-0123456789"  # 62 characters
FORK = "its-fork-with-an-equally-long-id-to-fill-the-parent-column-xyz"
FAILING = "failing-calls-run-with-a-long-id-" + "f" * 20
EVAL = "an-evaluation-run-whose-id-is-also-long-enough-to-be-cut-0000"
ERROR = ("upstream exploded while answering: the gateway returned a very long diagnostic text\n"
         "that goes on and on " + "and on " * 30)
ANSI = re.compile(r"\x1b\[|\x1b\]|\x1b")
WIDTHS = (80, 60)


def invoke(width: int | None, *args: str):
    env = {"COLUMNS": None if width is None else str(width)}
    res = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert res.exit_code == 0, res.output
    return res.output


def fits(text: str, width: int) -> list[str]:
    lines = text.splitlines()
    assert lines
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}:\n" + "\n".join(too_wide)
    assert not ANSI.search(text), "an escape sequence in output that is not a terminal"
    return lines


def shows_id(text: str, run_id: str) -> bool:
    """The id in full, or a prefix of it (at least 7 characters) cut with an ellipsis."""
    return run_id in text or any(run_id[:k] + "…" in text for k in range(7, len(run_id)))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("width")
    db = f"sqlite:///{tmp / 'w.db'}"
    runs = {}
    for width in WIDTHS:
        rid = f"{LONG}-{width}"
        runs[width] = invoke(width, "run", "--run-id", rid, "--epochs", "1", "-q", "--db", db)
    invoke(80, "fork", f"{LONG}-80", "step_1", "--run-id", FORK, "--no-run", "-q", "--db", db)

    def flaky(messages):
        if "letter" in messages[-1]["content"]:
            raise ValueError(ERROR)
        return "42"

    result = Trainer(small_config(num_epochs=1, llm_cache="lineage"), db=db, run_id=FAILING,
                     backend_factory=scripted_factory(target=flaky)).train()
    assert result.summary["failures"]["failed"] > 0
    result.store.close()
    skill = tmp / "best.md"
    invoke(80, "export", f"{LONG}-80", "--best", "-o", skill, "--db", db)
    return {"db": db, "run": runs, "failing": result.summary, "skill": skill}


@pytest.mark.parametrize("width", WIDTHS)
def test_the_run_summary_fits_and_names_the_run(world, width):
    lines = fits(world["run"][width], width)
    assert shows_id(lines[1], f"{LONG}-{width}") and "completed" in world["run"][width]
    for heading in ("val (hard)", "test by task type", "LLM calls", "cost (USD)", "all stages", "paid (sent)"):
        assert heading in world["run"][width], heading


@pytest.mark.parametrize("width", WIDTHS)
def test_runs_fits_with_long_ids_cut_by_an_ellipsis(world, width):
    out = invoke(width, "runs", "--db", world["db"])
    lines = fits(out, width)
    assert lines[0].split()[:3] == ["run", "parent", "status"]
    for rid in (f"{LONG}-80", f"{LONG}-60", FORK, FAILING):
        assert shows_id(out, rid), rid
    assert "…" in out  # the 62-character ids do not fit beside the other columns
    assert len(lines) == 2 + len(json.loads(invoke(width, "runs", "--json", "--db", world["db"])))  # no row wrapped


@pytest.mark.parametrize("width", WIDTHS)
def test_show_fits_and_keeps_its_step_table(world, width):
    out = invoke(width, "show", f"{LONG}-80", "--db", world["db"])
    lines = fits(out, width)
    header = next(line for line in lines if line.startswith("step "))
    assert header.split() == ["step", "epoch", "budget", "decision", "candidate", "current", "best"]
    rows = lines[lines.index(header) + 2:]
    assert [int(row.split()[0]) for row in rows] == list(range(1, len(rows) + 1)) and rows


@pytest.mark.parametrize("width", WIDTHS)
def test_failed_calls_fit_and_the_closing_line_stays_last_and_whole(world, width):
    s = world["failing"]
    closing = f"with {s['failures']['failed']} failed LLM calls of {s['failures']['calls']}"
    for text in (summary_text(s, width=width), invoke(width, "show", FAILING, "--db", world["db"])
                 .split("\nstep ")[0]):
        lines = fits(text, width)
        assert lines[-1].startswith("run ") and closing in lines[-1]
        assert "failed LLM calls" in text and "ValueError: upstrea" in text
        error_rows = [line for line in lines if "ValueError" in line]
        assert error_rows and all(line.endswith("…") for line in error_rows)  # cut, not wrapped


@pytest.mark.parametrize("width", WIDTHS)
def test_show_step_fits(world, width):
    out = invoke(width, "show", f"{LONG}-80", "--step", "1", "--db", world["db"])
    lines = fits(out, width)
    assert shows_id(lines[0], f"{LONG}-80") and "rollout:" in out and "gate:" in out
    failed = invoke(width, "show", FAILING, "--step", "1", "--db", world["db"])
    fits(failed, width)
    assert "failed calls" in failed and "ValueError: upstrea" in failed


@pytest.mark.parametrize("width", WIDTHS)
def test_eval_and_log_fit(world, width):
    out = invoke(width, "eval", "--skill", world["skill"], "--run-id", f"{EVAL}-{width}", "-q", "--db", world["db"])
    lines = fits(out, width)
    assert shows_id(lines[0], f"{EVAL}-{width}") and "by task type" in out and "cost (USD)" in out
    log = invoke(width, "log", f"{LONG}-80", "--db", world["db"])
    fits(log, width)
    assert "GateDecided" in log and "RunCompleted" in log
    lineage = invoke(width, "log", FORK, "--lineage", "--db", world["db"])
    fits(lineage, width)
    assert shows_id(lineage, f"{LONG}-80") and shows_id(lineage, FORK)


def test_without_columns_off_a_terminal_nothing_is_cut(world):
    """A pipe or a file without $COLUMNS gets every id whole (issue 41, item 11)."""
    out = invoke(None, "runs", "--db", world["db"])
    assert "…" not in out and not ANSI.search(out)
    for rid in (f"{LONG}-80", f"{LONG}-60", FORK, FAILING):
        assert rid in out


def test_no_escape_sequence_off_a_terminal_even_with_force_color(world):
    res = CliRunner().invoke(cli, ["show", f"{LONG}-80", "--db", world["db"]],
                             env={"COLUMNS": "80", "FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert res.exit_code == 0 and not ANSI.search(res.output)


def test_json_output_is_not_cut(world):
    rows = json.loads(invoke(60, "runs", "--json", "--db", world["db"]))
    assert {f"{LONG}-80", f"{LONG}-60", FORK, FAILING} <= {r["run_id"] for r in rows}


@pytest.mark.parametrize("width", [24, 40, 60, 80, 120])
def test_a_table_is_one_line_per_row_at_any_width(width):
    cols = [Col("id", shrink=True), Col("n", num=True), Col("score", num=True), Col("error", shrink=True)]
    rows = [["x" * 90, 12345, "0.500", "E: " + "boom " * 40], ["short", 1, "-", "line one\nline two"]]
    lines = table_lines(cols, rows, width)
    assert len(lines) == 2 + len(rows)
    assert all(cell_len(line) <= width for line in lines), lines
    assert "\n" not in "".join(lines)
    if width >= 40:
        assert "12345" in lines[2] and "0.500" in lines[2]  # numbers are never cut
        assert lines[2].split()[1] == "12345" and "line one" in lines[3]
    wide = table_lines(cols, [["a", 1, "0.5", "ok"]], 120)
    assert wide[0].split() == ["id", "n", "score", "error"] and wide[2].split() == ["a", "1", "0.5", "ok"]
