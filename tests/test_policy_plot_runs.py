"""`skillstate runs` and `skillstate plot` on policy training runs (kind policy): the runs list names the kind
and a policy's status and val scores; the figure draws the loss, GRPO's reward and the val score at each
validation from the log; a policy run is never drawn with a skill run. Marker `policy` (the train extra)."""

from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner
from policy_runs import policy_database

from skillstate.cli.main import cli
from skillstate.engine.runner import load_run
from skillstate.reading.policy_view import curves
from skillstate.storage.store import Store

pytestmark = pytest.mark.policy


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    pytest.importorskip("trl")
    return policy_database(tmp_path_factory.mktemp("policyplots"))


def invoke(*args, code=0):
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == code, res.output
    return res.output


def test_runs_lists_a_policy_run_with_its_kind_status_and_val_scores(url):
    rows = {r["run_id"]: r for r in json.loads(invoke("runs", "--json", "--db", url))}
    assert rows["bank"]["kind"] == "train/bank"
    store = Store(url)
    for rid, method in (("sft", "sft"), ("grpo", "grpo")):
        state = load_run(store, rid).state
        r = rows[rid]
        assert r["kind"] == f"policy/{method}" and r["status"] == "completed"
        assert r["baseline_score"] == state.policy.validated[0].scores.gate  # the base policy, at step 0
        assert r["best_score"] == state.best_score and r["best_step"] == state.best_step
    table = invoke("runs", "--db", url)
    assert table.splitlines()[0].split()[:4] == ["run", "parent", "status", "kind"]
    line = next(ln for ln in table.splitlines() if ln.startswith("grpo "))
    assert line.split()[1:3] == ["completed", "policy/grpo"]


def test_the_policy_figure_draws_the_curves_of_the_log(url):
    from skillstate.exports.policy_plots import load_policy, plot_policy

    store = Store(url)
    fig = plot_policy(load_policy(store, ["sft", "grpo"]))
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == ["(a) training loss", "(b) mean reward", "(c) val score"]
    for rid in ("sft", "grpo"):
        p = load_run(store, rid).state.policy
        (loss,) = [ln for ln in fig.axes[0].lines if ln.get_gid() == f"{rid}|loss"]
        assert list(zip(loss.get_xdata(), loss.get_ydata(), strict=True)) == curves(p)["loss"]
        (val,) = [ln for ln in fig.axes[2].lines if ln.get_gid() == f"{rid}|val"]
        assert list(val.get_xdata()) == [v.step for v in p.validated]
        assert list(val.get_ydata()) == [v.scores.gate for v in p.validated]
    (reward,) = [ln for ln in fig.axes[1].lines if ln.get_gid() == "grpo|reward"]
    assert list(zip(reward.get_xdata(), reward.get_ydata(), strict=True)) == curves(
        load_run(store, "grpo").state.policy)["reward"]
    assert not [ln for ln in fig.axes[1].lines if ln.get_gid() == "sft|reward"]  # SFT logs no reward
    (e,) = load_run(store, "grpo").state.policy.evolved
    kept = "kept" if e.accepted else "rejected"
    assert [c.get_gid() for c in fig.axes[2].collections] == [f"grpo|evolution_{kept}"]
    sft_only = plot_policy(load_policy(store, ["sft"]))
    assert [ax.get_title(loc="left") for ax in sft_only.axes] == ["(a) training loss", "(b) val score"]


def test_plot_of_a_policy_run_writes_the_file(url, tmp_path):
    out = tmp_path / "grpo.png"
    text = invoke("plot", "grpo", "-o", str(out), "--dpi", "50", "--db", url)
    assert text.startswith(f"wrote {out}") and text.rstrip().endswith(": grpo")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] > 300


@pytest.mark.parametrize("args, match", [
    (("sft", "bank"), "cannot draw policy run 'sft' with 'bank', a train run"),
    (("bank", "grpo"), "cannot draw policy run 'grpo' with 'bank'"),
    (("sft", "--x", "cost"), "--x cost is for skill runs"),
    (("sft", "sft"), "named twice"),
])
def test_a_policy_run_with_a_skill_run_or_the_cost_axis_is_refused_in_one_line(url, tmp_path, args, match):
    out = tmp_path / "x.png"
    text = invoke("plot", *args, "-o", str(out), "--db", url, code=2)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and match in lines[0], text
    assert not out.exists()


def test_a_policy_runs_status_counts_its_steps_trained(url):
    from dataclasses import replace

    from skillstate.log.events import StopConditionMet
    from skillstate.reading.history import status_of

    state = load_run(Store(url), "sft").state
    assert status_of(state) == "completed"
    going = replace(state, completed=False, policy=replace(state.policy, step=2))
    assert status_of(going) == "step 2/4"
    stop = StopConditionMet(condition="stop_file", reason="the stop file exists", step=2)
    assert status_of(replace(going, stopped=stop)) == "stopped at step 2/4"
    assert status_of(replace(going, policy=None)) == "started"
