"""The figure of policy training runs (kind policy: `skillstate sft`,
`skillstate grpo`) for `skillstate plot`: one panel per curve, one colour per
run, x = the optimizer step.

- (a) the training loss, every step TRL logged;
- (b) the mean reward per step, when a run is GRPO's;
- (c) the policy's val score at each validation (points; the base policy at
  step 0), the accepted evolutions of the bank marked ★, the rejected ✕.

Drawn from `skillstate.reading.policy_view.policy_summary`, folded from the
log; matplotlib is imported when a figure is drawn (see
`skillstate.exports.plots`). The functions never print.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skillstate.errors import UserError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from skillstate.storage.store import Store

# (summary curve, panel title, y label); the reward panel only when a run logged a reward (GRPO).
PANELS = (("loss", "training loss", "loss"), ("reward", "mean reward", "reward"))


def load_policy(store: Store, run_ids: list[str | None]) -> list[dict[str, Any]] | None:
    """The policy summaries of the runs named, each with its `run_id`; None when none is a policy run. Refuses
    a mix of policy runs and skill runs (they share no axis), a run named twice and a run with no trained step."""
    from skillstate.engine.runner import load_run
    from skillstate.reading.policy_view import policy_summary

    loaded: list[Any] = []
    for run_id in run_ids or [None]:
        run = load_run(store, run_id)
        if any(r.run_id == run.run_id for r in loaded):
            raise UserError(f"run {run.run_id!r} is named twice")
        loaded.append(run)
    policy = [r.run_id for r in loaded if r.state.kind == "policy"]
    if not policy:
        return None
    if len(policy) < len(loaded):
        other = next(r.run_id for r in loaded if r.state.kind != "policy")
        raise UserError(f"cannot draw policy run {policy[0]!r} with {other!r}, a {_kind(store, other)} run, in one "
                        "figure: a policy's curves are by training step, a skill's by skill step (plot them apart)")
    out = []
    for run in loaded:
        summary = policy_summary(run.state)
        if not summary.get("checkpoints"):
            raise UserError(f"policy run {run.run_id!r} has no trained step yet: nothing to plot")
        out.append({"run_id": run.run_id, **summary})
    return out


def _kind(store: Store, run_id: str) -> str:
    row = next((r for r in store.list_runs() if r.run_id == run_id), None)
    return row.kind if row is not None else "other"


def plot_policy(runs: list[dict[str, Any]], *, title: str | None = None) -> Figure:
    """The figure of `load_policy`'s summaries (see the module's docstring)."""
    from skillstate.exports.plots import COLORS, STYLE, _matplotlib

    mpl = _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [p for p in PANELS if any(p[0] in r["curves"] for r in runs)] or [PANELS[0]]
    n = len(panels) + 1
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(3.4 * n + 1.2, 3.4), layout="constrained")
        FigureCanvasAgg(fig)
        axes = list(fig.subplots(1, n, squeeze=False)[0])
        colors = {r["run_id"]: COLORS[i % len(COLORS)] for i, r in enumerate(runs)}
        for i, ((key, name, ylabel), ax) in enumerate(zip(panels, axes, strict=False)):
            for r in runs:
                points = r["curves"].get(key) or []
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], color=colors[r["run_id"]],
                            linewidth=1.4, marker="o" if len(points) <= 30 else None, markersize=2.5,
                            label=_label(r), gid=f"{r['run_id']}|{key}")
            _step_axis(ax, f"({'abc'[i]}) {name}", ylabel)
        _val_panel(axes[-1], runs, colors, f"({'abc'[len(panels)]}) val score")
        handles, labels = axes[-1].get_legend_handles_labels()
        legend = fig.legend(handles, labels, loc="outside right upper", frameon=False)
        legend.set_gid("policy_legend")
        if title:
            fig.suptitle(title, fontsize=11)
    return fig


def _label(run: dict[str, Any]) -> str:
    return f"{run['run_id']} ({run['method']})"


def _step_axis(ax: Axes, title: str, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(title, loc="left")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _val_panel(ax: Axes, runs: list[dict[str, Any]], colors: dict[str, str], title: str) -> None:
    from skillstate.exports.plots import INK

    for r in runs:
        color = colors[r["run_id"]]
        vals = r["validations"]
        ax.plot([v["step"] for v in vals], [v["score"] for v in vals], color=color, linewidth=0.8, linestyle=":",
                marker="o", markersize=5, label=_label(r), gid=f"{r['run_id']}|val")
        for kept in (True, False):
            done = [e for e in r["evolutions"] if e["accepted"] == kept and e["candidate_score"] is not None]
            if done:
                ax.scatter([e["step"] for e in done], [e["candidate_score"] for e in done], color=color,
                           marker="*" if kept else "X", s=90 if kept else 40, edgecolors=INK, linewidths=0.6,
                           zorder=5, gid=f"{r['run_id']}|evolution_{'kept' if kept else 'rejected'}",
                           label=f"evolved bank {'kept' if kept else 'not kept'} ({r['run_id']})")
    _step_axis(ax, title, "val score (gate)")
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, -0.03), max(hi, 1.03))


def policy_plot_to_file(runs: list[dict[str, Any]], output: str, *, fmt: str, title: str | None,
                        dpi: int) -> dict[str, Any]:
    """Draw and save the runs' figure; what was drawn, as `plots.plot_to_file` says it."""
    from skillstate.exports.plots import save_figure

    fig = plot_policy(runs, title=title)
    path = save_figure(fig, output, dpi=dpi)
    width, height = fig.get_size_inches()
    return {"path": str(path), "format": fmt, "runs": [r["run_id"] for r in runs], "kind": "policy",
            "steps": {r["run_id"]: r["steps"] for r in runs}, "bars": False,
            "pixels": [round(width * dpi), round(height * dpi)] if fmt == "png" else None,
            "bytes": path.stat().st_size}
