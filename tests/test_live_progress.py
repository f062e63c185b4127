"""Live progress: the engine's counts of calls per stage (progress kind
"calls"), the bar on a terminal, today's plain lines elsewhere, and
`--json-events`."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner
from conftest import scripted_factory, small_config

from skillstate.cli.main import cli
from skillstate.engine.meter import CallMeter, CallProgress
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

ANSI = re.compile(r"\x1b\[")
BAR = "━"


class Calls:
    """A progress callback keeping every report, in order (calls reports come from any thread)."""

    def __init__(self):
        self.reports = []
        self._lock = threading.Lock()

    def __call__(self, p):
        with self._lock:
            self.reports.append(p)

    def of(self, kind):
        return [p for p in self.reports if p.kind == kind]

    def finals(self):
        return [p.calls for p in self.of("calls") if p.calls.final]


def train(tmp_path, name="r", on_progress=None, **kw):
    store = Store(f"sqlite:///{tmp_path / (name + '.db')}")
    Trainer(small_config(num_epochs=1, **kw), store=store, run_id="r", on_progress=on_progress).train()
    return store


# --- the engine's counts ------------------------------------------------------


def test_each_stage_counts_its_calls_and_done_never_exceeds_planned(tmp_path):
    rec = Calls()
    store = train(tmp_path, on_progress=rec)
    calls = rec.of("calls")
    assert calls
    for c in (p.calls for p in calls):
        assert c.served + c.sent == c.done and c.failed <= c.done and c.run_calls >= c.done
        assert c.planned is None or c.done <= c.planned
    finals = {c.stage: c for c in rec.finals()}
    # the engine knows what a rollout or an evaluation asks for (one call an item in the qa world)
    assert finals["baseline"].planned == finals["baseline"].done == 60
    assert finals["test_best"].planned == 60
    rollouts = [c for c in rec.finals() if c.stage == "rollout"]
    assert rollouts and all(c.planned == c.done == 40 for c in rollouts)
    patches = [e for e in (p.event for p in rec.of("event")) if e.type == "PatchProposed"]
    assert sum(c.planned for c in rec.finals() if c.stage == "reflect") == len(patches)
    assert finals["aggregate"].planned is None and finals["aggregate"].done > 0  # a count without a total
    # work done ahead counts apart, never into the stage's bar
    assert any(c.ahead > 0 for c in rec.finals())
    assert rec.finals()[-1].cost_usd > 0 and rec.finals()[-1].max_cost_usd is None
    store.close()


def test_a_stage_reports_its_final_count_before_its_events_with_its_starting_state(tmp_path):
    rec = Calls()
    train(tmp_path, on_progress=rec).close()
    kinds = [(p.kind, p.stage, p.calls.final if p.calls else None) for p in rec.reports]
    for i, (kind, stage, final) in enumerate(kinds):
        if kind == "calls" and final:
            nxt = next(k for k in kinds[i + 1:] if k[0] != "calls")
            assert nxt[:2] == ("event", stage)  # nothing of the stage after its final count
    starts = {id(p.state): p.stage for p in rec.of("stage")}
    assert all(id(p.state) in starts and starts[id(p.state)] == p.stage for p in rec.of("calls"))
    stages_with_calls = {p.stage for p in rec.of("calls")}
    assert not stages_with_calls & {"start_step", "gate", "update", "complete"}  # no calls, no report


def test_a_fork_counts_the_calls_it_is_served_from_the_log(tmp_path):
    store = train(tmp_path)
    child = Trainer(store=store, run_id="r").fork(1, {"edit_budget": 2}, "child")
    rec = Calls()
    child.on_progress = rec
    child.train()
    first = next(c for c in rec.finals() if c.stage == "rollout")
    assert first.served == first.done == first.planned == 40 and first.sent == 0  # the parent's step-2 rollout
    store.close()


def test_failed_calls_are_counted(tmp_path):
    def flaky(messages):
        if "letter" in messages[-1]["content"]:
            raise ValueError("boom")
        return "42"

    rec = Calls()
    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    Trainer(small_config(num_epochs=1, llm_cache="lineage"), store=store, run_id="f", on_progress=rec,
            backend_factory=scripted_factory(target=flaky)).train()
    baseline = next(c for c in rec.finals() if c.stage == "baseline")
    assert 0 < baseline.failed < baseline.done == 60
    store.close()


def _log(store, run_id="r"):
    return [(s.seq, s.type, s.version, s.payload, s.hash) for s in store.read_events(run_id)]


def _journal(store, run_id="r"):
    return sorted((c.role, c.request_hash, c.error) for c in store.read_calls(run_id))


def test_the_events_and_the_call_journal_are_the_same_with_and_without_a_callback(tmp_path):
    def rude(p):  # slow, and raising on every count but the last: none of it may reach a call
        if p.kind == "calls" and not p.calls.final:
            time.sleep(0.01)
            raise RuntimeError("a broken progress bar")

    # what is sent ahead, and what is in flight at an early reject, depends on timing: both off here
    deterministic = dict(overlap_start=False, speculative_rollout=False, early_reject=False)
    plain = train(tmp_path, "plain", **deterministic)
    watched = train(tmp_path, "watched", on_progress=rude, **deterministic)
    assert _log(plain) == _log(watched) and len(_log(plain)) > 20
    assert _journal(plain) == _journal(watched)
    plain.close()
    watched.close()


def test_the_meter_reports_at_most_once_an_interval_from_many_threads_and_once_at_the_end():
    reports: list[CallProgress] = []
    meter = CallMeter(reports.append, lambda: (0.5, 2.0), interval=60)
    meter.begin("rollout")
    meter.expect(1000)

    def work():
        for i in range(125):
            meter.record(served=i % 5 == 0, failed=i % 25 == 0, background=False)
            meter.record(served=False, failed=False, background=True)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    meter.finish()
    assert [r.final for r in reports] == [False, True]  # the plan, then (nothing within the interval) the end
    last = reports[-1]
    assert (last.planned, last.done, last.served, last.sent, last.failed, last.ahead) == (1000, 1000, 200, 800, 40,
                                                                                          1000)
    assert last.run_calls == 2000 and (last.cost_usd, last.max_cost_usd) == (0.5, 2.0)
    meter.finish()  # once only
    assert len(reports) == 2


def test_a_plan_the_calls_outgrow_becomes_a_count():
    reports: list[CallProgress] = []
    meter = CallMeter(reports.append, interval=0)
    meter.begin("rollout")
    meter.expect(1)
    for _ in range(3):
        meter.record(served=False, failed=False, background=False)
    meter.finish()
    assert reports[-1].planned is None and reports[-1].done == 3


# --- the CLI --------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def call(runner, *args, env=None):
    return runner.invoke(cli, [str(a) for a in args], env=env)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('live') / 'cli.db'}"


def test_off_a_terminal_the_output_is_todays_plain_lines(runner, db):
    # CliRunner is no terminal; FORCE_COLOR and TTY_COMPATIBLE do not make it one
    res = call(runner, "run", "--run-id", "plain", "--epochs", "1", "--db", db,
               env={"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "TERM": "xterm-256color"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert not ANSI.search(res.output) and BAR not in res.output and "from log," not in res.output
    lines = out.splitlines()
    assert lines[0].startswith("started run plain in ")
    assert lines[1].startswith("baseline       val: hard ")
    assert lines[2] == "step 1/3  epoch 1  budget 4  batch 40"
    assert lines[3] == "    rollout    10/40 solved" and lines[4].startswith("    reflect    6 patches")


def test_quiet_stays_quiet(runner, db):
    res = call(runner, "run", "--run-id", "quiet", "--epochs", "1", "-q", "--db", db)
    assert res.exit_code == 0
    assert res.stdout.lstrip("\n").startswith("run quiet: completed") and "solved" not in res.stdout


def test_json_events_are_one_object_a_line_matching_the_log(runner, db):
    res = call(runner, "run", "--run-id", "ev", "--epochs", "1", "--json-events", "--db", db)
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines()]  # every line parses: nothing else on stdout
    *events, summary = lines
    logged = json.loads(call(runner, "log", "ev", "--json", "--db", db).stdout)
    assert [(e["seq"], e["type"]) for e in events] == [(e["seq"], e["type"]) for e in logged]
    assert [e["payload"] for e in events] == [e["payload"] for e in logged]
    assert [e["hash"] for e in events] == [e["hash"] for e in logged] and events[0]["type"] == "RunStarted"
    assert set(events[0]) == {"run_id", "seq", "type", "version", "hash", "prev_hash", "created_at", "payload"}
    assert summary["type"] == "summary" and summary["run_id"] == "ev"
    assert summary["summary"]["status"] == "completed"
    # resuming a completed run appends nothing: only the summary line
    again = call(runner, "resume", "ev", "--json-events", "--db", db)
    assert again.exit_code == 0 and [json.loads(x)["type"] for x in again.stdout.splitlines()] == ["summary"]


def test_json_events_of_a_fork_and_an_eval(runner, db, tmp_path):
    res = call(runner, "fork", "ev", "step_2", "--run-id", "ev-fork", "--json-events", "--db", db)
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    logged = json.loads(call(runner, "log", "ev-fork", "--json", "--db", db).stdout)
    assert [(e["seq"], e["type"]) for e in lines[:-1]] == [(e["seq"], e["type"]) for e in logged]
    assert lines[0]["type"] == "RunForked" and lines[-1]["type"] == "summary"
    skill = tmp_path / "skill.md"
    skill.write_text("# Answer\nAnswer in one word.\n", encoding="utf-8")
    res = call(runner, "eval", "--skill", skill, "--run-id", "ev-eval", "--json-events", "--db", db)
    assert res.exit_code == 0, res.output
    types = [json.loads(line)["type"] for line in res.stdout.splitlines()]
    assert types[0] == "RunStarted" and "TestEvaluated" in types and types[-1] == "summary"


@pytest.mark.parametrize("command", [["run"], ["resume", "ev"], ["fork", "ev", "1"], ["eval", "--skill", "x.md"]])
def test_json_and_json_events_exclude_each_other(runner, db, command):
    res = call(runner, *command, "--json", "--json-events", "--db", db)
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == ["Error: --json and --json-events cannot be combined: pick one"]


# --- the bar ----------------------------------------------------------------------


def test_a_forced_terminal_shows_a_bar_per_stage_and_the_lines_on_stdout(tmp_path, capsys):
    from rich.console import Console

    from skillstate.cli.live import LiveProgress, reporter

    screen = io.StringIO()
    live = reporter(console=Console(file=screen, force_terminal=True, width=120))
    assert isinstance(live, LiveProgress)
    with live:
        train(tmp_path, on_progress=live).close()
    bars, lines = screen.getvalue(), capsys.readouterr().out
    assert ANSI.search(bars) and BAR in bars
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bars)
    assert re.search(r"baseline .*\d+/60 calls, \d+ from log, 0 failed · \d+:\d\d elapsed", text)
    assert "  rollout " in text and re.search(r"run: [\d,]+ calls \([\d,]+ done ahead\), \$[\d.]+ spent", text)
    assert "    rollout    10/40 solved" in lines.splitlines() and not ANSI.search(lines)  # stdout: as without a bar


def _in_a_terminal(args: list, cwd) -> str:
    """Run the CLI with stdout and stderr on a pseudo-terminal; what it showed."""
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-c", "from skillstate.cli.main import cli; cli()",
                             *map(str, args)],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    return b"".join(chunks).decode("utf-8", errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_in_a_real_terminal_the_bar_shows_and_quiet_stays_quiet(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    shown = _in_a_terminal(["run", "--run-id", "t", "--epochs", "1", "--db", db], tmp_path)
    assert BAR in shown and "calls, " in shown and "from log" in shown
    assert "    rollout    10/40 solved" in shown and "run t: completed" in shown
    skill = tmp_path / "skill.md"
    skill.write_text("# Answer\nAnswer in one word.\n", encoding="utf-8")
    quiet = _in_a_terminal(["eval", "--skill", skill, "--run-id", "q", "-q", "--db", db], tmp_path)
    assert BAR not in quiet and "calls, " not in quiet and "run: " not in quiet
    assert quiet.lstrip().startswith("eval run q: evaluated")  # nothing before the results
