"""Figures for papers: a run's learning curves, or several runs overlaid, and
the per-task-type test scores of the baseline and the best skill.

Everything is drawn from `skillstate.reading.curves.run_curves`, folded from the log:
nothing here calls an LLM or writes to the database. matplotlib (the `plots`
extra) is imported by the functions that draw, on the Agg canvas, without
pyplot: importing this module is cheap and the figures share no global state.
The functions return or save a `Figure` and never print.

Panel (a), per run, one colour per run, x = the step (or, with
`x="cost"`, the cumulative cost in USD at list prices, a fork's inherited
steps included):
- the candidate's gate score on the validation split, one marker per step:
  accepted ▲, accepted as a new best ★, rejected ✕, skipped ○ (drawn at the
  current score: there was no candidate; in a skill-bank run, a step that
  distilled into the bank and gated nothing, labelled so), and a candidate rejected early
  drawn hollow ▽ at the upper bound that proved the reject;
- the current skill's score (a line) and the best score (a step line);
- the baseline (dashed) and the best skill's test score (◆, at the end).
A fork's inherited steps are drawn faded; when its parent is in the figure
too, the fork starts at its fork step.

Panel (b), drawn by `skillstate.exports.plot_bars`: the final test report per
task type (and over all items), the baseline skill against each run's best
skill (hard score).

Policy training runs (kind policy) are drawn by `skillstate.exports.policy_plots`
instead: their loss, reward and val score by training step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skillstate.errors import UserError
from skillstate.util import install_hint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from skillstate.storage.store import Store

INSTALL_HINT = f"plotting needs matplotlib: {install_hint('plots')}"
FORMATS = ("png", "pdf", "svg")
X_AXES = ("step", "cost")
DEFAULT_DPI = 200

# Okabe-Ito: distinguishable with every common colour-vision deficiency, and in grey print.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
BASELINE_GREY = "#8c8c8c"
INK = "#333333"
FADED = 0.3

# Marker per gate decision: (matplotlib marker, size, hollow, legend label).
MARKERS: dict[str, tuple[str, float, bool, str]] = {
    "accept_best": ("*", 120, False, "accepted, new best"),
    "accept": ("^", 46, False, "accepted"),
    "reject": ("X", 40, False, "rejected"),
    "reject_early": ("v", 40, True, "rejected early (bound)"),
    "skip": ("o", 34, True, "skipped (no candidate)"),
}
TEST_MARKER = ("D", 44)
# A skill-bank run (mode bank): its steps between validations distil into the bank and gate nothing.
BANK_SKIP_LABEL = "distilled, not gated"

STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e3e3",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "svg.fonttype": "none",  # text stays text in an SVG
    "pdf.fonttype": 42,  # TrueType in a PDF: journals ask for it
}


@dataclass(frozen=True)
class RunCurves:
    """One run's curves as panel (a) draws them."""

    run_id: str
    color: str
    data: dict[str, Any]
    steps: list[dict[str, Any]]  # the decided steps, in order
    parent_plotted: bool


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return matplotlib


def output_format(path: str | Path) -> str:
    """png, pdf or svg, from the file name's suffix."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        shown = f".{suffix}" if suffix else "no suffix"
        raise UserError(f"cannot tell the figure format from {str(path)!r} ({shown}): "
                        f"name the file .png, .pdf or .svg")
    return suffix


def load_curves(store: Store, run_ids: list[str | None]) -> list[dict[str, Any]]:
    """The curves of each run (None: the latest training run), refusing
    evaluation runs and runs with no decided step."""
    from skillstate.engine.runner import load_run
    from skillstate.reading.curves import run_curves
    from skillstate.reading.triggers import run_triggers

    out, seen = [], set()
    for run_id in run_ids or [None]:
        loaded = load_run(store, run_id)
        if loaded.run_id in seen:
            raise UserError(f"run {loaded.run_id!r} is named twice")
        seen.add(loaded.run_id)
        curves = run_curves(loaded)
        curves["triggers"] = run_triggers(store, loaded.state, loaded.lineage)  # progressive disclosure's rates
        if curves["kind"] == "eval":
            raise UserError(f"run {loaded.run_id!r} is an evaluation run: it has no learning curve to plot "
                            "(name a training run)")
        if not _decided(curves):
            raise UserError(f"run {loaded.run_id!r} has no completed step yet: nothing to plot")
        out.append(curves)
    return out


def _decided(curves: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in curves["steps"] if row.get("decision") is not None]


def plot_runs(store: Store, run_ids: list[str | None], *, x: str = "step", bars: bool = True,
              title: str | None = None) -> Figure:
    """The figure of one or several runs (the latest training run if none is named)."""
    return plot_curves(load_curves(store, run_ids), x=x, bars=bars, title=title)


def plot_curves(curves: list[dict[str, Any]], *, x: str = "step", bars: bool = True,
                title: str | None = None) -> Figure:
    """The figure of `run_curves` outputs (see the module's docstring)."""
    if x not in X_AXES:
        raise UserError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    if not curves:
        raise UserError("no run to plot")
    mpl = _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ids = {c["run_id"] for c in curves}
    runs = [RunCurves(c["run_id"], COLORS[i % len(COLORS)], c, _decided(c), c.get("parent_run_id") in ids)
            for i, c in enumerate(curves)]
    with_bars = bars and any("best" in c.get("tests", {}) for c in curves)
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(8.0, 6.4 if with_bars else 3.9), layout="constrained")
        FigureCanvasAgg(fig)
        if with_bars:
            top, bottom = fig.subplots(2, 1, height_ratios=[3.2, 2.2])
        else:
            top, bottom = fig.subplots(1, 1), None
        _curves_panel(top, runs, x)
        if bottom is not None:
            from skillstate.exports.plot_bars import bars_panel  # (it reads this module)

            bars_panel(bottom, runs)
        if title:
            fig.suptitle(title, fontsize=11)
    return fig


def _xs(run: RunCurves, x: str) -> tuple[float, list[float]]:
    """The x of the baseline (step 0) and of each decided step."""
    if x == "step":
        return 0.0, [float(row["step"]) for row in run.steps]
    first = run.steps[0]
    start = float(first.get("cumulative_cost_usd", 0.0)) - float(first.get("cost_usd", 0.0))
    return max(start, 0.0), [float(row.get("cumulative_cost_usd", 0.0)) for row in run.steps]


def as_float(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _marker_kind(row: dict[str, Any]) -> str:
    decision = row["decision"]
    if decision == "reject" and row.get("early_reject_bound") is not None:
        return "reject_early"
    return decision if decision in MARKERS else "accept"


def _marker_y(row: dict[str, Any], kind: str) -> float | None:
    if kind == "reject_early":
        return float(row["early_reject_bound"])
    if kind == "skip" or row.get("candidate_score") is None:
        return row.get("current_score")
    return float(row["candidate_score"])


def _scatter(ax: Axes, xs: list[float], ys: list[float], kind: str, color: str, alpha: float, gid: str) -> None:
    marker, size, hollow, _label = MARKERS[kind]
    if not xs:
        return
    if hollow:
        ax.scatter(xs, ys, s=size, marker=marker, facecolors="white", edgecolors=color, linewidths=1.1,
                   alpha=alpha, zorder=4, gid=gid)
    else:
        ax.scatter(xs, ys, s=size, marker=marker, color=color, edgecolors="white", linewidths=0.5,
                   alpha=alpha, zorder=5, gid=gid)


def _curves_panel(ax: Axes, runs: list[RunCurves], x: str) -> None:
    from matplotlib.lines import Line2D

    single = len(runs) == 1
    used: set[str] = set()
    for index, run in enumerate(runs):
        c, color = run.data, run.color
        x0, xs = _xs(run, x)
        # Several runs on a step axis: each run's markers a little to the side, so equal scores stay visible.
        dodge = (index - (len(runs) - 1) / 2) * min(0.16, 0.5 / len(runs)) if x == "step" else 0.0
        base = (c.get("baseline") or {}).get("gate")
        fork_step = c.get("fork_step") or 0
        own = [not (row.get("inherited") or (fork_step and row["step"] <= fork_step)) for row in run.steps]
        # Points of the current and best lines: the baseline, then each decided step.
        px = [x0, *xs]
        cur = [as_float(base), *(as_float(row.get("current_score")) for row in run.steps)]
        best = [as_float(base), *(as_float(row.get("best_score")) for row in run.steps)]
        mine = [not fork_step, *own]  # the baseline belongs to the run that computed it
        split = mine.index(True) if True in mine else len(mine)
        start = max(split - 1, 0)  # an own segment starts at the last inherited point (the fork step)
        if base is not None and not (fork_step and run.parent_plotted):  # a fork inherits its baseline
            ax.axhline(base, color=BASELINE_GREY if single else color, linestyle=(0, (4, 3)), linewidth=1.0,
                       alpha=0.9 if single else 0.6, zorder=1, gid=f"{run.run_id}|baseline")
        if split > 0 and not run.parent_plotted:  # a fork's inherited steps, faded
            ax.plot(px[:split], cur[:split], color=color, linewidth=1.2, alpha=FADED, zorder=2,
                    gid=f"{run.run_id}|current_inherited")
            ax.plot(px[:split], best[:split], color=color, linewidth=2.0, alpha=FADED, drawstyle="steps-post",
                    zorder=2, gid=f"{run.run_id}|best_inherited")
        ax.plot(px[start:], cur[start:], color=color, linewidth=1.2, zorder=3, gid=f"{run.run_id}|current")
        ax.plot(px[start:], best[start:], color=color, linewidth=2.2, alpha=0.55, drawstyle="steps-post",
                zorder=2, solid_capstyle="butt", gid=f"{run.run_id}|best")
        if fork_step:
            fx = px[min(split - 1, len(px) - 1)] if split > 0 else px[0]
            ax.axvline(fx, color=color, linestyle=":", linewidth=1.0, alpha=0.8, zorder=1,
                       gid=f"{run.run_id}|fork")
        for inherited in (True, False):
            if inherited and run.parent_plotted:
                continue
            groups: dict[str, tuple[list[float], list[float]]] = {}
            for row, rx, is_own in zip(run.steps, xs, own, strict=True):
                if is_own == inherited:
                    continue
                kind = _marker_kind(row)
                y = _marker_y(row, kind)
                if y is None:
                    continue
                gx, gy = groups.setdefault(kind, ([], []))
                gx.append(rx + dodge)
                gy.append(y)
                used.add(kind)
            for kind, (gx, gy) in groups.items():
                _scatter(ax, gx, gy, kind, color, FADED if inherited else 1.0,
                         f"{run.run_id}|{kind}{'|inherited' if inherited else ''}")
        test = (c.get("tests") or {}).get("best")
        if test is not None and test.get("gate") is not None:
            # after the last step; on the cost axis, at what the run cost with its test evaluations
            tx = px[-1] + 0.4 + dodge if x == "step" else max(px[-1], float(c.get("cost_usd") or 0.0))
            ax.scatter([tx], [test["gate"]], s=TEST_MARKER[1], marker=TEST_MARKER[0], color=color,
                       edgecolors=INK, linewidths=0.7, zorder=6, gid=f"{run.run_id}|test_best")
            used.add("test")
            if single:
                ax.annotate(f"test {test['gate']:.3f}", (tx, test["gate"]), xytext=(-6, -5),
                            textcoords="offset points", fontsize=8, color=INK, ha="right", va="top")
        if x == "step" and single and c.get("steps_per_epoch"):
            per = int(c["steps_per_epoch"])
            for start_step in range(per + 1, int(max(xs)) + 1, 2 * per):  # every other epoch shaded
                ax.axvspan(start_step - 0.5, start_step + per - 0.5, color="#f2f2f2", linewidth=0, zorder=0)

    metric = runs[0].data.get("gate_metric") or "gate"
    ax.set_ylabel(f"validation score ({metric})")
    if x == "step":
        ax.set_xlabel("step" + (" (shading: every other epoch)" if single and runs[0].data.get("steps_per_epoch")
                                else ""))
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.set_xlabel("cumulative cost (USD, list prices)")
    lo, hi = ax.get_ylim()
    ax.set_ylim(max(lo, -0.03), min(hi, 1.04) if hi <= 1.2 else hi)
    ax.set_title("(a) validation score per step" if x == "step" else "(a) validation score against cost",
                 loc="left")

    handles: list[Any] = [
        Line2D([], [], color=INK, linewidth=1.2, label="current skill"),
        Line2D([], [], color=INK, linewidth=2.2, alpha=0.55, label="best so far"),
        Line2D([], [], color=BASELINE_GREY if single else INK, linestyle=(0, (4, 3)), linewidth=1.0,
               label="baseline"),
    ]
    for kind in ("accept_best", "accept", "reject", "reject_early", "skip"):
        if kind not in used:
            continue
        marker, size, hollow, label = MARKERS[kind]
        if kind == "skip" and all(r.data.get("mode") == "bank" for r in runs):
            label = BANK_SKIP_LABEL  # a bank step that only distilled was not skipped: nothing was gated
        face = "white" if hollow else INK
        handles.append(Line2D([], [], marker=marker, markersize=(size ** 0.5) * 0.9, markerfacecolor=face,
                              markeredgecolor=INK, label=label, color=INK,
                              linestyle="none"))
    if "test" in used:
        handles.append(Line2D([], [], marker=TEST_MARKER[0], markersize=6, markerfacecolor=INK,
                              markeredgecolor=INK, label="best skill on test", color=INK, linestyle="none"))
    if any(r.data.get("fork_step") for r in runs):
        handles.append(Line2D([], [], color=INK, linestyle=":", linewidth=1.0, label="fork step"))
    header = None
    if single and not runs[0].data.get("fork_step"):
        header = runs[0].run_id
    else:
        handles.append(Line2D([], [], linestyle="none", label=""))
        for run in runs:
            handles.append(Line2D([], [], color=run.color, linewidth=3, label=_run_label(run)))
    legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                       handlelength=2.2, borderaxespad=0.0, title=header, title_fontsize=8, alignment="left")
    legend.set_gid("curves_legend")


def _run_label(run: RunCurves) -> str:
    c = run.data
    if not c.get("fork_step"):
        return run.run_id
    return f"{run.run_id}\nfork of {c.get('parent_run_id')}\nat step {c['fork_step']}"


def save_figure(fig: Figure, path: str | Path, *, dpi: int = DEFAULT_DPI) -> Path:
    """Write the figure; the format comes from the suffix (png, pdf, svg)."""
    fmt = output_format(path)
    out = Path(path)
    # No tool version or date in the file: the same run gives the same bytes.
    metadata = {"png": {"Software": None}, "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
                "svg": {"Creator": None, "Date": None}}[fmt]
    try:
        fig.savefig(out, format=fmt, dpi=dpi, facecolor="white", metadata=metadata)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}") from None
    return out


def plot_to_file(store: Store, run_ids: list[str | None], output: str | Path, *, x: str = "step", bars: bool = True,
                 title: str | None = None, dpi: int = DEFAULT_DPI) -> dict[str, Any]:
    """Draw and save; what was drawn, for the CLI to say."""
    fmt = output_format(output)  # refuse a bad name before any work
    if dpi < 20 or dpi > 2400:
        raise UserError(f"--dpi must be 20 to 2400, got {dpi}")
    from skillstate.exports.policy_plots import load_policy, policy_plot_to_file

    policy = load_policy(store, run_ids)
    if policy is not None:  # policy training runs: their loss, reward and val score by training step
        if x != "step":
            raise UserError(f"--x {x} is for skill runs: a policy run's curves are by training step")
        return policy_plot_to_file(policy, str(output), fmt=fmt, title=title, dpi=dpi)
    curves = load_curves(store, run_ids)
    fig = plot_curves(curves, x=x, bars=bars, title=title)
    path = save_figure(fig, output, dpi=dpi)
    width, height = fig.get_size_inches()
    return {"path": str(path), "format": fmt, "runs": [c["run_id"] for c in curves],
            "steps": {c["run_id"]: len(_decided(c)) for c in curves},
            "bars": bars and len(fig.axes) > 1 and any("best" in c.get("tests", {}) for c in curves),
            "pixels": [round(width * dpi), round(height * dpi)] if fmt == "png" else None,
            "bytes": path.stat().st_size}
