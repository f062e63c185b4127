"""Progress while a run runs: a live bar per stage on a terminal, today's
plain lines elsewhere, or (--json-events) one JSON object per event.

The engine reports through its progress callback; this module only renders
what it reports (the plain lines are `render.ProgressPrinter`'s). The bar
goes to stderr, and only when stderr is an interactive terminal: stdout
keeps exactly what it holds without one (the stage lines, the JSON), so a
pipe or a file sees the same bytes either way.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import click
from rich.console import Console, RenderableType
from rich.progress import BarColumn, ProgressColumn, Task, TaskID, TextColumn
from rich.progress import Progress as Bars
from rich.table import Column
from rich.text import Text

from skillstate.cli.render import ProgressPrinter, warnings_only
from skillstate.engine.context import Progress
from skillstate.engine.meter import CallProgress
from skillstate.storage.store import Store, StoredEvent

Callback = Callable[[Progress], None]


def interactive(stream: Any) -> bool:
    """A terminal a bar can redraw itself on: a tty whose TERM is not dumb.
    FORCE_COLOR does not make one (CI logs get the plain lines)."""
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "").lower() not in ("dumb", "unknown")


def reporter(*, quiet: bool = False, as_json: bool = False, events: JsonEvents | None = None,
             console: Console | None = None) -> Plain | LiveProgress:
    """The progress callback of a command, as a context manager to train in.

    --quiet: warnings only, never a bar. --json: warnings only, and the bar
    when stderr is a terminal. --json-events: the events as JSON lines, and
    the bar when stderr is a terminal. Else the stage lines, with the bar
    when stderr is a terminal. `console` forces the bar onto it (tests)."""
    if quiet or (console is None and not interactive(sys.stderr)):
        return Plain(events or (warnings_only if quiet or as_json else ProgressPrinter()))
    console = console or Console(stderr=True, highlight=False, emoji=False)
    return LiveProgress(console, lines=not (as_json or events), events=events,
                        stdout_tty=console.file is sys.stderr and interactive(sys.stdout))


class Plain:
    """A callback that prints lines, with nothing to start or stop."""

    def __init__(self, callback: Callback):
        self.callback = callback

    def __call__(self, p: Progress) -> None:
        self.callback(p)

    def __enter__(self) -> Plain:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def usd(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def totals_text(c: CallProgress) -> str:
    """The running totals under the bars: this command's calls, the run's cost."""
    ahead = f" ({c.ahead:,} done ahead)" if c.ahead else ""
    cost = "" if c.cost_usd is None else f", {usd(c.cost_usd)} spent" + (
        f" of {usd(c.max_cost_usd)}" if c.max_cost_usd is not None else "")
    return f"run: {c.run_calls:,} call{'s' * (c.run_calls != 1)}{ahead}{cost}"


class _Times(ProgressColumn):
    """`· 0:04 elapsed, 0:03 left` (without a total: the elapsed time only)."""

    def render(self, task: Task) -> Text:
        elapsed = _clock(task.elapsed)
        if task.total is None or task.finished:
            return Text(f"· {elapsed} elapsed", style="progress.elapsed")
        left = _clock(task.time_remaining) if task.time_remaining is not None else "-:--"
        return Text(f"· {elapsed} elapsed, {left} left", style="progress.remaining")


def _clock(seconds: float | None) -> str:
    s = int(seconds or 0)
    return f"{s // 60}:{s % 60:02d}" if s < 3600 else f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class _Bars(Bars):
    """The bars, and under them one line of running totals."""

    totals = ""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.totals:
            yield Text(self.totals, style="dim")


class LiveProgress:
    """A bar per stage on `console` (stderr), the stage lines above it.

    A stage's bar appears with its first count of calls (at once when the
    stage knows how many it plans) and goes when its events come; its line
    is then printed as without a terminal: on stdout, or, when stdout is the
    same terminal, through the console so that the bar stays at the bottom."""

    def __init__(self, console: Console, *, lines: bool = True, events: JsonEvents | None = None,
                 stdout_tty: bool = False):
        self.console = console
        self.echo: Callable[[str], None] = self._print if stdout_tty else click.echo
        if events is not None:
            events.echo = self.echo
        self.inner: Callback | None = events or (ProgressPrinter(echo=self.echo) if lines else None)
        text = Column(no_wrap=True)  # on a narrow terminal the bar gives way, the text is cut, nothing wraps
        self.bars = _Bars(TextColumn("{task.description}", table_column=text), BarColumn(bar_width=None),
                          TextColumn("{task.fields[detail]}", table_column=text), _Times(table_column=text),
                          console=console, transient=True, expand=True, redirect_stdout=stdout_tty,
                          redirect_stderr=False)
        self._task: TaskID | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> LiveProgress:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

    def _print(self, line: str) -> None:
        if not self.bars.live.is_started:  # before or after the bars: stdout, as always
            click.echo(line)
            return
        self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

    def __call__(self, p: Progress) -> None:
        if p.kind == "calls":
            assert p.calls is not None  # a Progress of kind "calls" always carries its counts
            self._count(p.calls)
            return
        if p.kind == "warning":
            if self.bars.live.is_started:
                self.console.print(f"warning: {p.stage}", markup=False, highlight=False, emoji=False, soft_wrap=True)
            else:
                click.echo(f"warning: {p.stage}", err=True)
            return
        if p.kind == "stage":
            self._drop()
            with self._lock:
                self._task = self.bars.add_task(f"  {stage_label(p.stage):<9}", total=None, visible=False,
                                                detail="")
            return
        self._drop()  # the stage's events: its line replaces its bar
        if self.inner is not None:
            self.inner(p)

    def _count(self, c: CallProgress) -> None:
        of = f"/{c.planned:,}" if c.planned is not None else ""
        failed = f"[red]{c.failed:,} failed[/]" if c.failed else "0 failed"  # (markup: TextColumn's default)
        with self._lock:
            self.bars.totals = totals_text(c)
            if self._task is None:
                return
            # Drawn at once: the meter reports at most ten times a second, and a
            # stage shorter than the bars' own refresh period is still shown.
            self.bars.update(self._task, total=c.planned, completed=c.done, visible=True,
                             detail=f"{c.done:,}{of} calls, {c.served:,} from log, {failed}", refresh=True)

    def _drop(self) -> None:
        with self._lock:
            if self._task is not None:
                shown = any(t.id == self._task and t.visible for t in self.bars.tasks)
                self.bars.remove_task(self._task)
                self._task = None
                if shown:
                    self.bars.refresh()  # before a line is printed above it: never a stale bar under the line


# A stage's bar is named as its line is ("eval", "test", "lr", ...), not by the engine's name for the stage.
STAGE_LABELS = {"eval_skill": "eval", "test_baseline": "test", "test_best": "test", "test_no_skill": "test",
                "learning_rate": "lr",
                "seed_bank": "import", "validate_bank": "validate", "prune_propose": "prune",
                "prune_decide": "prune", "final_validate": "final", "final_score": "final", "final_select": "final",
                "epoch_compare": "epoch end", "slow_update": "epoch end", "slow_update_decide": "epoch end",
                "meta_skill": "epoch end", "end_epoch": "epoch end"}


def stage_label(stage: str) -> str:
    """The name a stage's line uses for it (`ProgressPrinter.line`)."""
    return STAGE_LABELS.get(stage, stage)


def _when(value: dt.datetime | None) -> str | None:
    """ISO 8601 in UTC (a database that drops the zone gives back UTC)."""
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).isoformat()


def event_line(s: StoredEvent) -> str:
    """One stored event as one line of JSON; `payload` is its canonical JSON as stored (and hashed)."""
    head = json.dumps({"run_id": s.run_id, "seq": s.seq, "type": s.type, "version": s.version, "hash": s.hash,
                       "prev_hash": s.prev_hash, "created_at": _when(s.created_at)}, ensure_ascii=False,
                      separators=(",", ":"))
    return f'{head[:-1]},"payload":{s.payload}}}'


class JsonEvents:
    """--json-events: every event this command appends, as one JSON object
    a line on stdout (flushed), and at the end one `{"type": "summary"}`
    line; warnings go to stderr.

    Events appended before the engine reports (RunStarted, RunForked) are
    read back from the store, so the lines hold every seq after `after`."""

    def __init__(self, store: Store, after: int = 0):
        self.store = store
        self.last = after
        self.echo: Callable[[str], None] = click.echo

    def __call__(self, p: Progress) -> None:
        if p.kind == "warning":
            click.echo(f"warning: {p.stage}", err=True)
        if p.kind != "event" or p.stored is None:
            return
        self.catch_up(p.stored.run_id, before=p.stored.seq)
        self._write(p.stored)

    def catch_up(self, run_id: str, before: int | None = None) -> None:
        """The run's events after the last one written (and before `before`)."""
        if before is not None and before <= self.last + 1:
            return
        for s in self.store.read_events(run_id):
            if s.seq > self.last and (before is None or s.seq < before):
                self._write(s)

    def _write(self, s: StoredEvent) -> None:
        self.echo(event_line(s))
        self.last = s.seq

    def summary(self, run_id: str, summary: dict[str, Any]) -> None:
        self.catch_up(run_id)
        self.echo(json.dumps({"type": "summary", "run_id": run_id, "summary": summary}, ensure_ascii=False,
                             separators=(",", ":"), default=str))
