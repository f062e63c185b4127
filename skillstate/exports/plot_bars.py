"""Panel (b) of `skillstate.exports.plots`' figure: the final test report per task type (and over all
items, and with progressive disclosure the skill's trigger rates), the baseline skill against each run's best
skill (hard score), with the items counted under each category."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skillstate.exports.plots import INK, RunCurves, as_float

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# With progressive disclosure, bars after the task types: (label, key of reading.triggers' rates).
TRIGGER_BARS = (("trigger recall", "recall"), ("trigger precision", "precision"))


def bars_panel(ax: Axes, runs: list[RunCurves]) -> None:
    """Panel (b) on `ax`: each category's test score, the baseline skill against each run's best."""
    from matplotlib.patches import Patch

    with_test = [r for r in runs if "best" in (r.data.get("tests") or {})]
    types: list[str] = sorted({t for r in with_test for t in r.data["tests"]["best"].get("by_task_type", {})})
    rates = TRIGGER_BARS if any(r.data.get("triggers") for r in with_test) else ()  # progressive disclosure
    cats = ["all items", *types, *(label for label, _key in rates)]

    def scores(report: dict[str, Any] | None, run: RunCurves, label: str) -> list[float]:
        if report is None:
            return [float("nan")] * len(cats)
        by = report.get("by_task_type", {})
        trig = (run.data.get("triggers") or {}).get(f"test_{label}") or {}
        return ([report.get("hard", float("nan"))] + [by.get(t, {}).get("hard", float("nan")) for t in types]
                + [as_float(trig.get(key)) for _label, key in rates])

    def counts(report: dict[str, Any], run: RunCurves) -> list[int | None]:
        by = report.get("by_task_type", {})
        trig = (run.data.get("triggers") or {}).get("test_best") or {}
        return [report.get("n")] + [by.get(t, {}).get("n") for t in types] + [trig.get("rollouts") for _ in rates]

    baselines = [scores(r.data["tests"].get("baseline"), r, "baseline") for r in with_test]
    shared_baseline = all(b == baselines[0] for b in baselines)
    series: list[tuple[str, list[float], dict[str, Any]]] = []
    if shared_baseline:
        series.append(("baseline skill", baselines[0], dict(facecolor="#bdbdbd", edgecolor="white")))
    else:
        for run, b in zip(with_test, baselines, strict=True):
            series.append((f"baseline skill ({run.run_id})", b,
                           dict(facecolor="white", edgecolor=run.color, hatch="////", linewidth=0.8)))
    for run in with_test:
        best_step = run.data.get("best_step")
        label = f"best skill (step {best_step})" if len(with_test) == 1 else f"best skill ({run.run_id})"
        series.append((label, scores(run.data["tests"]["best"], run, "best"),
                       dict(facecolor=run.color, edgecolor="white")))

    import numpy as np

    k = len(series)
    width = min(0.8 / k, 0.32)
    centers = np.arange(len(cats), dtype=float)
    centers[1:] += 0.4  # a gap after "all items"
    for i, (label, values, style) in enumerate(series):
        offs = centers + (i - (k - 1) / 2) * width
        bars = ax.bar(offs, values, width=width * 0.92, label=label, zorder=3, gid=f"bars|{label}", **style)
        if k <= 2:
            ax.bar_label(bars, labels=[f"{v:.2f}" if v == v else "" for v in values], fontsize=6.5, padding=1.5,
                         color=INK)
    n = counts(with_test[0].data["tests"]["best"], with_test[0])
    ax.set_xticks(centers, [_wrap(name) + (f"\nn={count}" if count is not None else "")
                            for name, count in zip(cats, n, strict=True)])
    ax.tick_params(axis="x", length=0)
    ax.set_ylim(0, 1.12)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.grid(axis="x", visible=False)
    ax.set_ylabel("test score (hard)" + (", rate" if rates else ""))
    split = with_test[0].data["tests"]["best"].get("split", "test")
    ax.set_title(f"(b) {split} score by task type{' and skill trigger rates' if rates else ''}, baseline against "
                 "best", loc="left")
    handles = [Patch(label=label, **{k: v for k, v in style.items() if k != "linewidth"})
               for label, _values, style in series]
    legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                       borderaxespad=0.0)
    legend.set_gid("bars_legend")


def _wrap(name: str, width: int = 11) -> str:
    """A task type's name on lines of about `width` characters (at `_` or spaces)."""
    lines: list[str] = []
    for word in name.replace("_", " ").split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines) or name
