"""Multi-turn environments on the sim backend: the episode loop, the
analysts' window, training end to end with audit and verify, and resume
after a crash in the middle of a multi-turn rollout stage."""

from __future__ import annotations

import sys

import pytest
from conftest import EXAMPLES, Crash, assert_paid_once, crashing_factory, logical_usage
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.config import SkillConfig
from skillstate.engine.runner import lineage_events
from skillstate.envs.episode import EpisodeSettings
from skillstate.envs.episode_loop import episode_prompt, window
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

ROOMS = "python:rooms_env:RoomsEnv"


@pytest.fixture(autouse=True)
def rooms_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_episode"))
    yield
    sys.modules.pop("rooms_env", None)


def rooms_config(**kw) -> SkillConfig:
    base = {"env": ROOMS, "num_epochs": 2, "batch_size": 10, "minibatch_size": 5, "episode": {"max_turns": 20}}
    return SkillConfig(**{**base, **kw})


def _payloads(store, run_id):
    return [(s.type, s.payload) for s in lineage_events(store, run_id)]


@pytest.fixture(scope="module")
def rooms_run(tmp_path_factory):
    """A run `r` of the rooms world on the defaults (the minibatch screen with its ranking fallback among them):
    the tests that read it, the uninterrupted run the crash tests compare with, the concurrency test's run at the
    default concurrency, and the fork test's parent (in a copy of its database, `copy_of_rooms_run`)."""
    with pytest.MonkeyPatch.context() as mp:  # `rooms_on_path` is per test: this module-wide run needs its own
        mp.syspath_prepend(str(EXAMPLES / "custom_episode"))
        db = f"sqlite:///{tmp_path_factory.mktemp('rooms') / 'r.db'}"
        yield Trainer(rooms_config(), db=db, run_id="r").train()
    sys.modules.pop("rooms_env", None)


def test_a_sim_run_in_a_text_world_learns_audits_and_verifies(rooms_run):
    result = rooms_run
    s = result.summary
    assert s["status"] == "completed"
    assert s["best_score"] >= s["baseline_score"] + 0.3
    assert s["test"]["best"]["hard"] > s["test"]["baseline"]["hard"]
    assert s["rejects"] >= 1
    assert audit(result.store, "r").ok
    report = verify(result.store, "r")
    assert report.ok and report.checked == report.total


def copy_of_rooms_run(rooms_run, dest) -> Store:
    """A store on a copy of `rooms_run`'s database (SQLite's backup: whole, whatever its WAL holds), for a test
    that writes to it."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(rooms_run.store.engine.url.database)) as src, closing(sqlite3.connect(dest)) as dst:
        src.backup(dst)
    return Store(f"sqlite:///{dest}")


def test_the_trajectory_blob_holds_every_turn_and_the_result_every_call(rooms_run):
    import json

    store = rooms_run.store
    rollout = next(s.event for s in lineage_events(store, "r") if s.type == "RolloutCompleted")
    for r in rollout.results:
        traj = json.loads(store.get_blob(r.trajectory))
        assert traj["kind"] == "episode" and traj["seed"] == r.seed is not None
        assert len(traj["turns"]) == r.turns == len(r.calls) and r.call is None
        assert [t["request"] for t in traj["turns"]] == [c.request_hash for c in r.calls]
        assert all({"action", "observation", "reward", "score", "reply"} <= set(t) for t in traj["turns"])
        assert r.hard == (1.0 if traj["success"] else 0.0)
        if not traj["success"]:
            assert r.fail_reason.split(":")[0] in ("max_turns", "invalid_actions", "episode_lost")
    # usage counts every call of every episode
    assert rollout.usage()["target"].calls == sum(len(r.calls) for r in rollout.results)


def test_what_the_analysts_saw_is_a_recorded_window(tmp_path):
    import json

    result = Trainer(rooms_config(num_epochs=1, episode={"max_turns": 20, "reflect_last": 2,
                                                         "reflect_max_turns": 3}),
                     db=f"sqlite:///{tmp_path / 'r.db'}", run_id="r").train()
    from sqlalchemy import select

    from skillstate.storage.schema import llm_calls

    with result.store.engine.connect() as conn:
        requests = [json.loads(r) if isinstance(r, str) else r for (r,) in conn.execute(
            select(llm_calls.c.request).where(llm_calls.c.role == "optimizer"))]
    failures = [m["content"] for r in requests for m in r["messages"] if "<failures>" in m["content"]]
    assert failures
    body = failures[0].split("<failures>")[1].split("</failures>")[0]
    views = json.loads(body)
    for v in views:
        assert len(v["turns"]) <= 3 and len(v["shown_turns"]) == len(v["turns"]) <= v["total_turns"]
        assert v["shown_turns"] == [t["turn"] for t in v["turns"]]


def test_an_invalid_run_ends_the_episode_with_a_clear_reason(tmp_path):
    def babble(config, env, role):
        from skillstate.sim.backend import sim_backend_for

        real = sim_backend_for(env)

        class Babbler:
            name = "sim"

            def complete(self, request):
                from skillstate.llm.base import ChatResponse

                if "<skill>" in request.message_dicts()[-1]["content"]:
                    return real.complete(request)
                return ChatResponse(text="Action: dance wildly", prompt_tokens=5, completion_tokens=3)

        return Babbler()

    result = Trainer(rooms_config(num_epochs=1, eval_test=False, episode={"max_turns": 20, "max_invalid": 3}),
                     db=f"sqlite:///{tmp_path / 'b.db'}", run_id="b", backend_factory=babble).train()
    rollout = next(s.event for s in lineage_events(result.store, "b") if s.type == "RolloutCompleted")
    assert all(r.turns == 3 and r.hard == 0 for r in rollout.results)
    assert all(r.fail_reason.startswith("invalid_actions: 3 invalid actions in a row, the last 'dance wildly'")
               for r in rollout.results)


@pytest.mark.parametrize("after_calls", [40, 400])  # inside the baseline, inside a later rollout
def test_resume_after_a_crash_mid_episode_stage_is_identical_and_pays_nothing_twice(tmp_path, after_calls, rooms_run):
    clean = rooms_run  # the uninterrupted run (read only)
    store = Store(f"sqlite:///{tmp_path / 'crash.db'}")
    with pytest.raises(Crash):
        Trainer(rooms_config(), store=store, run_id="r", backend_factory=crashing_factory(after_calls)).train()
    assert audit(store, "r").ok
    resumed = Trainer(store=store, run_id="r").train()
    assert _payloads(store, "r") == _payloads(clean.store, "r")
    assert logical_usage(resumed.summary) == logical_usage(clean.summary)
    assert_paid_once(store, "r")


def test_same_log_whatever_the_concurrency(tmp_path, rooms_run):
    a = Trainer(rooms_config(concurrency=1), db=f"sqlite:///{tmp_path / 'a.db'}", run_id="r").train()
    b = rooms_run  # the default concurrency, 8
    assert b.state.config["concurrency"] == 8
    drop = lambda rows: [(t, p) for t, p in rows if t != "RunStarted"]  # noqa: E731  (config differs)
    assert drop(_payloads(a.store, "r")) == drop(_payloads(b.store, "r"))


# --- the pure parts ------------------------------------------------------------

turn_scores = st.lists(st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 1.0])), max_size=60)


@given(turn_scores, st.integers(1, 10), st.booleans(), st.integers(1, 20))
@settings(max_examples=200, deadline=None)
def test_the_window_holds_the_last_turns_and_the_score_changes_within_its_cap(scores, last, changes, cap):
    turns = [{"turn": i + 1, "score": s} for i, s in enumerate(scores)]
    cfg = EpisodeSettings(reflect_last=last, reflect_score_changes=changes, reflect_max_turns=cap)
    shown = window(turns, cfg)
    assert shown == sorted(set(shown)) and all(0 <= i < len(turns) for i in shown)
    assert len(shown) <= cap
    tail = list(range(max(0, len(turns) - min(last, cap)), len(turns)))
    assert set(tail) <= set(shown)  # the most recent turns always make it
    if changes and len(shown) < cap:
        before = 0.0
        for i, t in enumerate(turns):
            if t["score"] is not None and t["score"] != before:
                assert i in shown
                before = t["score"]


def test_the_target_prompt_lists_every_action_and_windows_the_turns():
    from skillstate.prompts import builtin

    turns = [{"action": f"move east {i}", "observation": f"room {i}"} for i in range(10)]
    text = episode_prompt(builtin("episode_user"), "Find the coin.", "You are in the kitchen.", turns, "room 9",
                          EpisodeSettings(history=3))
    assert "Actions taken so far (10): move east 0 | " in text and "move east 9" in text
    assert text.count("\n> ") == 3 and "> move east 6\nroom 6" not in text and "> move east 7\nroom 7" in text


@pytest.mark.parametrize("features", [
    dict(use_slow_update=True, use_meta_skill=True, lr_control="autonomous", slow_update_gate=True),
    dict(update_mode="rewrite", accumulation=2, num_epochs=2),
    dict(update_mode="full_rewrite", gate_metric="mixed", semantic_density_weight=0.1),
], ids=["slow-meta-autonomous", "rewrite-accumulation", "full-rewrite-mixed"])
def test_every_skillopt_feature_works_on_an_episode_env(tmp_path, features):
    cfg = rooms_config(**{"num_epochs": 3, **features})
    result = Trainer(cfg, db=f"sqlite:///{tmp_path / 'f.db'}", run_id="f").train()
    assert result.summary["status"] == "completed"
    types = {s.type for s in lineage_events(result.store, "f")}
    if features.get("use_slow_update"):
        assert {"SlowUpdateDecided", "MetaSkillWritten"} <= types
    assert audit(result.store, "f").ok
    report = verify(result.store, "f")
    assert report.ok and report.checked == report.total


def test_fork_from_a_step_of_an_episode_run_reuses_its_calls(tmp_path, rooms_run):
    from skillstate.engine.create import fork_run

    store = copy_of_rooms_run(rooms_run, tmp_path / "k.db")
    sent_before = len(store.read_calls("r"))
    child = fork_run(store, "r", 2, {"lr_scheduler": "linear"}, run_id="c", probe=False)
    Trainer(store=store, run_id=child).train()
    assert len(store.read_calls("r")) == sent_before
    assert audit(store, "c").ok and verify(store, "c").ok


@pytest.mark.slow  # two whole text-world runs, one through the sim server: about 9 s
def test_a_text_world_run_through_the_openai_client_against_the_sim_server_matches_the_sim(tmp_path, monkeypatch):
    import yaml

    from skillstate.cli.tools import sim_world_named
    from skillstate.sim.server import SimServer

    monkeypatch.setenv("OPENAI_API_KEY", "local-test-key")
    settings = {"env": ROOMS, "num_epochs": 1, "batch_size": 10, "minibatch_size": 5, "episode": {"max_turns": 20}}
    config_file = tmp_path / "rooms.yaml"
    config_file.write_text(yaml.safe_dump(settings), encoding="utf-8")
    sim = Trainer(SkillConfig(**settings), db=f"sqlite:///{tmp_path / 's.db'}", run_id="s").train().summary
    with SimServer(sim_world_named(None, None, str(config_file))) as server:
        role = {"model": "sim", "base_url": server.base_url, "max_retries": 0}
        result = Trainer(SkillConfig(**settings, backend="openai", target=role, optimizer=role),
                         db=f"sqlite:///{tmp_path / 'o.db'}", run_id="o").train()
    s = result.summary
    assert s["status"] == "completed"
    assert (s["baseline_score"], s["best_score"], s["test"]) == (sim["baseline_score"], sim["best_score"], sim["test"])
    assert audit(result.store, "o").ok and verify(result.store, "o").ok


def test_the_screen_falls_back_to_the_ranking_when_no_edit_passes_alone(rooms_run, tmp_path):
    """In the rooms world one rule rarely wins back two failures alone: with `edit_screen_fallback: rank` (the
    default, `rooms_run`) such a step still selects by the ranking and reaches the gate, and the run learns;
    with `none` it is skipped, as runs logged before the fallback did."""
    def steps(result):
        events = [s.event for s in lineage_events(result.store, "r")]
        failed = {e.step for e in events if e.type == "EditsScreened" and e.tried and not any(t.passed for t in
                                                                                                e.tried)}
        return failed, {e.step: e for e in events if e.type == "EditsSelected"}

    config = rooms_run.state.config
    assert (config["edit_screen"], config["edit_screen_fallback"]) == ("minibatch", "rank")
    failed, selected = steps(rooms_run)
    assert failed and all(selected[s].method in ("all", "ranked", "fallback") and selected[s].edits for s in failed)
    cfg = rooms_config(edit_screen_fallback="none")
    failed, selected = steps(Trainer(cfg, db=f"sqlite:///{tmp_path / 'none.db'}", run_id="r").train())
    assert failed and all(selected[s].method == "none" and not selected[s].edits for s in failed)


def test_a_run_logged_before_the_screen_was_on_reads_it_off_and_its_fallback_none():
    from skillstate.log.event_codec import decode

    started = {"config": {"num_epochs": 1}, "initial_skill": "h", "dataset": {}, "dataset_fingerprint": "f",
               "prompts": {}, "steps_per_epoch": 1, "total_steps": 1, "package_version": "0"}
    old = decode("RunStarted", 13, started).config
    assert old["edit_screen"] == "off" and old["edit_screen_fallback"] == "none"
    assert decode("RunStarted", 13, {**started, "config": {"edit_screen": "minibatch"}}).config["edit_screen"] == \
        "minibatch"
    assert "edit_screen_fallback" not in decode("RunStarted", 14, started).config  # a new run's defaults apply
    forked = {"parent_run_id": "p", "fork_step": 1, "parent_event_count": 3, "parent_event_hash": "h",
              "overrides": {}, "config": {}, "prompts": {}, "steps_per_epoch": 1, "total_steps": 1}
    assert decode("RunForked", 11, forked).config["edit_screen_fallback"] == "none"
