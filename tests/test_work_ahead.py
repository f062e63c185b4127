"""Work done ahead of time (overlap_start, speculative_rollout): it fills the
concurrency cap without ever exceeding it, the stage under way goes first,
the events are exactly those of a run without it, and its only trace is the
call table (used later, or counted as unused in the summary)."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import Crash, assert_paid_once, crashing_factory, small_config
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.engine.lanes import CERTAIN, FOREGROUND, SPECULATIVE, Slots
from skillstate.engine.runner import lineage_events, make_backend
from skillstate.log.event_codec import encode
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import canonical_json


class InFlight:
    """A backend factory whose calls take `delay` seconds and which records
    the most calls it ever had in flight at once, across roles."""

    def __init__(self, delay: float = 0.004):
        self.delay, self.now, self.most = delay, 0, 0
        self.lock = threading.Lock()

    def __call__(self, config, env, role):
        real, meter = make_backend(config, env, role), self

        class Timed:
            name = real.name

            def complete(self, request):
                with meter.lock:
                    meter.now += 1
                    meter.most = max(meter.most, meter.now)
                try:
                    time.sleep(meter.delay)
                    return real.complete(request)
                finally:
                    with meter.lock:
                        meter.now -= 1

        return Timed()


def _events(store: Store, run_id: str) -> list[str]:
    return [canonical_json([s.type, encode(s.event)]) for s in lineage_events(store, run_id)[1:]]


def _run(tmp_path, name: str, factory=None, **kw):
    store = Store(f"sqlite:///{tmp_path / f'{name}.db'}")
    cfg = small_config(concurrency=4, **kw)
    return Trainer(cfg, store=store, run_id="r", backend_factory=factory).train()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ahead"), "plain", overlap_start=False, speculative_rollout=False)


@pytest.mark.parametrize("overlap,speculate", [(True, False), (True, True), (False, True)])
def test_work_ahead_changes_no_event_and_never_exceeds_the_cap(tmp_path, plain, overlap, speculate):
    meter = InFlight()
    result = _run(tmp_path, "ahead", meter, overlap_start=overlap, speculative_rollout=speculate)
    assert _events(result.store, "r") == _events(plain.store, "r")
    assert 1 < meter.most <= 4
    assert audit(result.store, "r").ok
    report = verify(result.store, "r")
    assert report.ok and report.checked == report.total
    assert_paid_once(result.store, "r")


def test_the_work_at_the_start_is_all_used(tmp_path):
    # without early reject (whose calls in flight may go unused) and speculation, nothing is sent in vain
    on = _run(tmp_path, "on", InFlight(), overlap_start=True, early_reject=False)
    off = _run(tmp_path, "off", InFlight(), overlap_start=False, early_reject=False)
    for result in (on, off):
        assert all(u["unused"] == 0 for u in result.summary["usage"].values())
    assert {r: u["sent"] for r, u in on.summary["usage"].items()} == {
        r: u["sent"] for r, u in off.summary["usage"].items()}


def test_an_early_reject_leaves_no_call_in_flight_unused(tmp_path, plain):
    # items go out only as far as all of them failing could take the reject (scoring.send_limit)
    result = _run(tmp_path, "reject", InFlight(0.01), overlap_start=False, speculative_rollout=False)
    assert _events(result.store, "r") == _events(plain.store, "r")
    assert any(s.type == "CandidateEvaluated" and s.event.partial is not None
               for s in lineage_events(result.store, "r"))
    assert all(u["unused"] == 0 for u in result.summary["usage"].values())


def test_speculation_that_misses_is_counted_as_unused(tmp_path):
    result = _run(tmp_path, "spec", InFlight(0.01), speculative_rollout=True, early_reject=False)
    usage = result.summary["usage"]["target"]
    assert result.summary["accepts"] > 0
    assert usage["unused"] > 0  # rollouts under a skill the gate then replaced
    assert usage["sent"] - usage["unused"] <= usage["calls"]
    hashes = {c.request_hash for c in result.store.read_calls("r")}
    assert len(hashes) == len(result.store.read_calls("r"))  # still nothing sent twice


def test_a_crash_with_work_ahead_in_flight_resumes_to_the_same_events(tmp_path, plain):
    store = Store(f"sqlite:///{tmp_path / 'crash.db'}")
    cfg = small_config(concurrency=4, speculative_rollout=True)
    with pytest.raises(Crash):
        Trainer(cfg, store=store, run_id="r", backend_factory=crashing_factory(300)).train()
    Trainer(cfg, store=store, run_id="r").train()
    assert _events(store, "r") == _events(plain.store, "r")
    assert verify(store, "r").ok
    assert_paid_once(store, "r")


def test_a_waiting_foreground_task_goes_before_any_background_one():
    slots = Slots(1)
    order: list[str] = []
    started = threading.Event()

    def task(name: str, foreground: bool, hold: float = 0.0) -> None:
        with slots.hold(FOREGROUND if foreground else CERTAIN):
            order.append(name)
            started.set()
            time.sleep(hold)

    first = threading.Thread(target=task, args=("first", True, 0.1))
    first.start()
    started.wait()
    background = [threading.Thread(target=task, args=(f"bg{i}", False)) for i in range(3)]
    for t in background:
        t.start()
    time.sleep(0.02)
    foreground = threading.Thread(target=task, args=("fg", True))
    foreground.start()
    for t in (first, *background, foreground):
        t.join()
    assert order[:2] == ["first", "fg"] and sorted(order[2:]) == ["bg0", "bg1", "bg2"]
    assert slots.busy == 0


def test_a_dead_endpoint_stops_both_lanes_at_the_breaker(tmp_path):
    from skillstate.errors import LLMStop
    from skillstate.llm.base import CallFailed

    def dead(config, env, role):
        class Dead:
            name = "dead"

            def complete(self, request):
                time.sleep(0.002)
                raise CallFailed("HTTP 500 after 1 attempt: server error")

        return Dead()

    store = Store(f"sqlite:///{tmp_path / 'dead.db'}")
    with pytest.raises(LLMStop, match="16 LLM calls in a row failed"):
        Trainer(small_config(concurrency=4, overlap_start=True), store=store, run_id="r",
                backend_factory=dead).train()
    assert 16 <= len(store.read_calls("r")) <= 16 + 4  # nothing more is sent once the breaker opened
    assert [s.type for s in lineage_events(store, "r")] == ["RunStarted"]


def test_speculative_work_waits_out_a_burst_but_certain_work_does_not():
    slots = Slots(4)
    ran: list[str] = []

    def task(name: str, lane: str) -> None:
        with slots.hold(lane):
            ran.append(name)

    with slots.burst():
        threads = [threading.Thread(target=task, args=(name, lane))
                   for name, lane in (("certain", CERTAIN), ("speculative", SPECULATIVE))]
        for t in threads:
            t.start()
        threads[0].join(timeout=5)
        time.sleep(0.05)
        assert ran == ["certain"]  # a free slot, but the stage under way may need it next
    threads[1].join(timeout=5)
    assert ran == ["certain", "speculative"]


class _MapRecorder:
    """Just what merge_levels needs of a run context: a map and merge_batch_size; it records each map's size."""

    def __init__(self, size: int):
        self.config = type("C", (), {"merge_batch_size": size})()
        self.maps: list[int] = []

    def map(self, fn, items):
        items = list(items)
        self.maps.append(len(items))
        return [fn(i) for i in items]


def _merger(side: str):
    from skillstate.log.events import MergeCall

    def merge(level, group):
        return f"{side}{level}({'+'.join(group)})", MergeCall(level=level, side=side, inputs=len(group), status="ok")

    return merge


@given(st.lists(st.integers(0, 30), min_size=1, max_size=3), st.integers(2, 5))
@settings(max_examples=60, deadline=None)
def test_independent_merge_trees_go_out_together_and_merge_as_they_would_alone(sizes, batch):
    from skillstate.engine.reflect import merge_levels

    trees = [([f"{chr(97 + t)}{i}" for i in range(n)], _merger(chr(97 + t))) for t, n in enumerate(sizes)]
    together = _MapRecorder(batch)
    joint = merge_levels(together, trees)
    for tree, result in zip(trees, joint, strict=True):
        alone = _MapRecorder(batch)
        assert merge_levels(alone, [tree]) == [result]
    singles = []
    for tree in trees:
        rec = _MapRecorder(batch)
        merge_levels(rec, [tree])
        singles.append(len(rec.maps))
    assert len(together.maps) == max(singles)  # one round of calls per level, not one per tree and level
