"""`skillstate plot` and `skillstate.exports.plots`: the figure's data matches the log,
the files are what their suffix says, and every refusal is one line."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import small_config

from skillstate.cli.main import cli
from skillstate.engine.runner import load_run
from skillstate.reading.curves import run_curves
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

pytest.importorskip("matplotlib")

from skillstate.exports.plots import MARKERS, plot_runs  # noqa: E402
from skillstate.util import install_hint  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run stopped before its baseline, a small run `base` (6 steps), its fork `fk` at step 3 and an evaluation
    run."""
    root = tmp_path_factory.mktemp("plots")
    url = f"sqlite:///{root / 'p.db'}"
    store = Store(url)
    stop = root / "STOP"
    stop.touch()
    Trainer(small_config(stop_file=str(stop)), store=store, run_id="empty").train()
    trainer = Trainer(small_config(), store=store, run_id="base")
    trainer.train()
    trainer.fork(step=3, overrides={"lr_scheduler": "linear"}, new_run_id="fk").train()  # the latest
    skill = root / "skill.md"
    skill.write_text("# Answer\n\n- Be brief.\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["eval", "--skill", str(skill), "--run-id", "ev", "-q", "--db", url])
    assert res.exit_code == 0, res.output
    yield store, url
    store.close()


def plot(url, *args, code=0):
    res = CliRunner().invoke(cli, ["plot", *args, "--db", url])
    assert res.exit_code == code, res.output
    return res


def one_line_error(url, *args, match=""):
    res = plot(url, *args, code=2)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in res.output, res.output
    assert match in lines[0], lines[0]
    return lines[0]


def by_gid(fig, prefix):
    """The artists of the first panel whose gid starts with `prefix`."""
    ax = fig.axes[0]
    return [a for a in [*ax.lines, *ax.collections] if (a.get_gid() or "").startswith(prefix)]


def decided(store, run_id):
    return [r for r in run_curves(load_run(store, run_id))["steps"] if r["decision"] is not None]


def test_png_of_one_run(runs, tmp_path):
    _store, url = runs
    out = tmp_path / "curves.png"
    res = plot(url, "base", "-o", str(out), "--dpi", "100")
    assert "wrote" in res.output and "800x640 px" in res.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (800, 640)
    assert 15_000 < len(data) < 1_000_000


def test_the_figure_holds_the_log(runs):
    store, _url = runs
    state = load_run(store, "base").state
    rows = decided(store, "base")
    fig = plot_runs(store, ["base"])
    assert len(fig.axes) == 2  # the curves and the per-task-type bars
    (current,) = by_gid(fig, "base|current")
    assert len(current.get_xdata()) == len(rows) + 1  # the baseline, then every step
    assert list(current.get_ydata()[1:]) == [r["current_score"] for r in rows]
    (best,) = by_gid(fig, "base|best")
    assert best.get_drawstyle() == "steps-post" and list(best.get_ydata())[-1] == state.best_score
    markers = {a.get_gid().split("|")[1]: a for a in by_gid(fig, "base|") if a.get_gid().split("|")[1] in MARKERS}
    assert sum(len(a.get_offsets()) for a in markers.values()) == len(rows)
    rejects = sum(len(markers[k].get_offsets()) for k in ("reject", "reject_early") if k in markers)
    assert rejects == state.count("reject")
    early = [r for r in rows if r["early_reject_bound"] is not None]
    if early:  # drawn at the bound, with a legend entry saying so
        assert sorted(markers["reject_early"].get_offsets()[:, 1]) == sorted(r["early_reject_bound"] for r in early)
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert "rejected early (bound)" in labels
    assert len(markers["accept_best"].get_offsets()) == state.count("accept_best")
    (test,) = by_gid(fig, "base|test_best")
    assert test.get_offsets()[0][1] == state.tests["best"].scores.gate
    (baseline,) = by_gid(fig, "base|baseline")
    assert baseline.get_ydata()[0] == state.baseline.gate
    bars = fig.axes[1]
    types = state.tests["best"].scores.by_task_type
    assert len(bars.get_xticks()) == len(types) + 1  # all items, then each task type
    heights = sorted(p.get_height() for p in bars.patches)
    assert heights == sorted([state.tests["best"].scores.hard, *(v.hard for v in types.values()),
                              state.tests["baseline"].scores.hard,
                              *(v.hard for v in state.tests["baseline"].scores.by_task_type.values())])


def test_runs_overlaid_get_one_colour_each_and_a_fork_starts_at_its_fork_step(runs):
    store, _url = runs
    fig = plot_runs(store, ["base", "fk"])
    (base,), (fork,) = by_gid(fig, "base|current"), by_gid(fig, "fk|current")
    assert base.get_color() != fork.get_color()
    assert fork.get_xdata()[0] == 3  # its parent is drawn: the fork's line starts at the fork step
    assert not by_gid(fig, "fk|current_inherited")
    labels = " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert "base" in labels and "fk" in labels and "fork of base" in labels
    assert len(decided(store, "fk")) == len(decided(store, "base"))


def test_a_fork_alone_shows_its_inherited_steps_faded(runs):
    store, _url = runs
    fig = plot_runs(store, ["fk"])
    (inherited,) = by_gid(fig, "fk|current_inherited")
    assert inherited.get_alpha() < 0.5 and list(inherited.get_xdata()) == [0, 1, 2, 3]
    assert by_gid(fig, "fk|fork")


def test_x_cost_is_the_cumulative_cost(runs, tmp_path):
    store, url = runs
    rows = decided(store, "base")
    fig = plot_runs(store, ["base"], x="cost", bars=False)
    assert len(fig.axes) == 1
    (current,) = by_gid(fig, "base|current")
    xs = list(current.get_xdata())
    assert xs[1:] == [r["cumulative_cost_usd"] for r in rows] and xs == sorted(xs) and xs[0] >= 0
    assert "cost" in fig.axes[0].get_xlabel()
    plot(url, "base", "fk", "--x", "cost", "--no-bars", "-o", str(tmp_path / "budget.png"))


def test_svg_and_pdf_come_from_the_suffix(runs, tmp_path):
    _store, url = runs
    plot(url, "base", "fk", "-o", str(tmp_path / "c.svg"), "--title", "linear vs cosine")
    svg = (tmp_path / "c.svg").read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "linear vs cosine" in svg
    plot(url, "base", "-o", str(tmp_path / "c.PDF"))
    assert (tmp_path / "c.PDF").read_bytes()[:5] == b"%PDF-"


def test_the_latest_training_run_by_default(runs, tmp_path):
    _store, url = runs
    assert "fk" in plot(url, "-o", str(tmp_path / "latest.png")).output


def test_refusals_are_one_line(runs, tmp_path):
    _store, url = runs
    one_line_error(url, "ev", "-o", str(tmp_path / "e.png"), match="is an evaluation run")
    one_line_error(url, "empty", "-o", str(tmp_path / "e.png"), match="has no completed step")
    one_line_error(url, "nope", "-o", str(tmp_path / "e.png"), match="unknown run 'nope'")
    one_line_error(url, "base", "-o", str(tmp_path / "e.jpg"), match=".png, .pdf or .svg")
    one_line_error(url, "base", "base", "-o", str(tmp_path / "e.png"), match="named twice")
    one_line_error(url, "base", "-o", str(tmp_path / "missing" / "e.png"), match="cannot write")
    assert not list(tmp_path.iterdir())


def test_without_matplotlib_the_error_says_what_to_install(runs, tmp_path, monkeypatch):
    _store, url = runs
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    one_line_error(url, "base", "-o", str(tmp_path / "e.png"), match=install_hint("plots"))


def test_help_loads_neither_matplotlib_nor_mlflow():
    code = ("import sys; from click.testing import CliRunner; from skillstate.cli.main import cli; "
            "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0; "
            "r = CliRunner().invoke(cli, ['plot', '--help']); assert 'Example' in r.output; "
            "r = CliRunner().invoke(cli, ['export-mlflow', '--help']); assert 'Example' in r.output; "
            "print(sorted(m for m in ('matplotlib', 'mlflow', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_bank_run_has_no_budget_panel_and_its_distil_only_steps_are_not_called_skipped(tmp_path):
    from skillstate.exports.plots import BANK_SKIP_LABEL

    store = Store(f"sqlite:///{tmp_path / 'bank.db'}")
    Trainer(small_config(num_epochs=1, mode="bank"), store=store, run_id="b").train()
    fig = plot_runs(store, ["b"])
    assert len(fig.axes) == 2  # the curves and the per-task-type bars: no edit budget
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert BANK_SKIP_LABEL in labels and MARKERS["skip"][3] not in labels
    store.close()
