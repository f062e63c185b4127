"""A person in the loop (issue 43): a step under `review` stops the run, a decision from the CLI (or the
timeout) lets it go on, and the log stays exact: audit, replay --verify, forks, old logs, refusals."""

from __future__ import annotations

import json
import threading
import time

import pytest
from click.testing import CliRunner
from conftest import small_config
from run_helpers import OLD_LOOP

from skillstate.cli.main import cli
from skillstate.config import SkillConfig
from skillstate.config_views import stored_config
from skillstate.engine.loading import load_run
from skillstate.engine.review_desk import ReviewTaken, decide
from skillstate.errors import ReviewPending, UserError
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.reading.audit import audit, verify
from skillstate.reading.history import status_of
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

# 3 steps, no test split at the end: a review run of a second or two
FAST = ["--epochs", "1", "--set", "eval_test=false", *OLD_LOOP]


def fast(**kw) -> SkillConfig:
    return small_config(num_epochs=1, eval_test=False, **kw)


def call(*args, code=0, env=None):
    res = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert res.exit_code == code, res.output
    return res


def of_type(store, run_id, cls):
    return [s.event for s in store.read_events(run_id) if s.type == cls.type]


def waiting_run(store, run_id="r", **kw):
    """A run stopped at its first reviewed step."""
    with pytest.raises(ReviewPending) as stop:
        Trainer(fast(**{"review": "accepted", **kw}), store=store, run_id=run_id).train()
    return stop.value


def finish(store, run_id, reviewer="bob"):
    """Resume `run_id`, approving every later step whole, to the end."""
    for _ in range(20):
        try:
            return Trainer(store=store, run_id=run_id).train()
        except ReviewPending:
            decide(store, run_id, "approve", reviewer=reviewer)
    raise AssertionError("the run never completed")


# --- the done-when flow, from the CLI --------------------------------------------------------------------------


def test_cli_run_stops_at_its_first_accepted_step_is_approved_without_an_edit_and_goes_on(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    res = call("run", "--run-id", "r", *FAST, "--set", "review=accepted", "--db", db, code=5)
    assert "review     step 1 awaits review" in res.output
    assert f"skillstate review r --db {db}" in res.output and f"skillstate resume r --db {db}" in res.output
    assert json.loads(call("runs", "--json", "--db", db).output)[0]["status"] == "awaiting_review"

    shown = call("review", "r", "--db", db, env={"COLUMNS": "200"}).output
    assert "step 1 awaits review" in shown and "the gate: accept_best" in shown
    assert "diff of skill:" in shown and "+++ candidate/skill" in shown and "task type" in shown
    assert "  1. [applied]" in shown and "proposed by the failure analyst" in shown and "cost: this step $" in shown
    view = json.loads(call("review", "r", "--json", "--db", db).output)
    assert view["waiting"] and view["droppable"] and len(view["edits"]) >= 2
    kept_text = view["edits"][0]["content"]
    gone_text = view["edits"][1]["content"] or view["edits"][1]["target"]

    res = call("review", "r", "--step", "1", "--approve", "--drop", "2", "--comment", "too broad",
               "--reviewer", "alice", "--db", db)
    assert "recorded: step 1: approve without edit 2 by alice: too broad" in res.output
    assert f"go on with: skillstate resume r --db {db}" in res.output

    store = Store(db)
    for _ in range(10):  # each later accepted step stops too: approve it whole
        res = CliRunner().invoke(cli, ["resume", "r", "--db", db])
        if res.exit_code == 0:
            break
        assert res.exit_code == 5, res.output
        call("review", "r", "--approve", "--reviewer", "bob", "--db", db)
    else:
        raise AssertionError("the run never completed")
    assert "completed" in res.output
    decided = of_type(store, "r", ReviewDecided)
    assert decided[0].reviewer == "alice" and decided[0].dropped == [1] and decided[0].comment == "too broad"
    assert all(d.reviewer == "bob" and not d.dropped for d in decided[1:])
    state = load_run(store, "r").state
    step1 = state.record(1)
    assert step1.decision in ("accept", "accept_best") and "approved in review by alice without edit 2" in step1.reason
    from skillstate.engine.review import rebuild
    from skillstate.reading.skill_text import skill_text

    request = of_type(store, "r", ReviewRequested)[0]
    kept = skill_text(store, step1.current_skill)
    assert kept != skill_text(store, request.candidate) and kept_text in kept
    # the rebuilt candidate is what was kept: the base patched with every edit but the second
    assert kept == rebuild(stored_config(dict(state.config)), skill_text(store, request.base_skill), request, [1])[0]
    assert request.edits[1].edit.content == gone_text or request.edits[1].edit.target == gone_text
    call("audit", "r", "--db", db)
    assert "reproduces all" in call("replay", "r", "--verify", "--db", db).output
    log = call("log", "r", "--db", db).output
    assert "ReviewRequested" in log and "approve without edit 2 by alice" in log
    store.close()


def test_the_rebuilt_candidate_is_gated_on_its_own_score_and_verify_reproduces_it(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    waiting_run(store)
    request = load_run(store, "r").state.progress.review
    decide(store, "r", "approve", step=1, dropped=[0], reviewer="alice")
    finish(store, "r")
    events = [s.event for s in store.read_events("r") if getattr(s.event, "step", None) == 1]
    types = [e.type for e in events]
    at = types.index("ReviewDecided")
    assert types[at + 1:] == ["CandidateBuilt", "CandidateEvaluated", "GateDecided"]
    rebuilt, scored, gated = events[at + 1:]
    assert rebuilt.skill != request.candidate and scored.partial is None and scored.skill == rebuilt.skill
    assert gated.candidate_score == scored.scores.gate
    assert audit(store, "r").ok and verify(store, "r").ok
    store.close()


# --- what the person decides ------------------------------------------------------------------------------------


def test_a_reject_keeps_the_current_skill_and_counts_the_edits_as_rejected(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    waiting_run(store)
    before = load_run(store, "r").state
    request = before.progress.review
    decide(store, "r", "reject", comment="not like this", reviewer="alice")
    done = finish(store, "r")
    rec = done.state.record(1)
    assert rec.decision == "reject" and rec.current_skill == before.current_skill
    assert "rejected in review by alice (the gate's verdict: accept_best" in rec.reason
    assert "not like this" in rec.reason
    e = request.edits[0].edit
    assert load_run(store, "r").state.rejected_edits.get((e.keyed_op, e.target, e.content), 0) >= 1
    assert audit(store, "r").ok and verify(store, "r").ok
    store.close()


def test_review_all_stops_at_a_rejected_step_too_and_a_person_cannot_let_it_in(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    cfg = small_config(num_epochs=2, eval_test=False, review="all")
    for _ in range(30):
        try:
            Trainer(cfg, store=store, run_id="r").train()
            break
        except ReviewPending:
            request = load_run(store, "r").state.progress.review
            if request.verdict.decision == "reject":
                with pytest.raises(UserError, match="the gate kept nothing"):
                    decide(store, "r", "approve", dropped=[0], reviewer="alice")
            decide(store, "r", "approve", reviewer="alice")
    requested = of_type(store, "r", ReviewRequested)
    assert {r.verdict.decision for r in requested} >= {"reject", "accept_best"}
    state = load_run(store, "r").state
    for r in requested:
        if r.verdict.decision == "reject":
            assert state.record(r.step).decision == "reject" and "confirmed in review by alice" in \
                state.record(r.step).reason
    assert audit(store, "r").ok and verify(store, "r").ok
    store.close()


def test_review_new_best_stops_only_at_a_new_best(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    cfg = small_config(num_epochs=2, eval_test=False, review="new_best")
    for _ in range(30):
        try:
            Trainer(cfg, store=store, run_id="r").train()
            break
        except ReviewPending:
            decide(store, "r", "approve", reviewer="alice")
    state = load_run(store, "r").state
    reviewed = {r.step for r in of_type(store, "r", ReviewRequested)}
    assert reviewed == {rec.step for rec in state.history if rec.decision == "accept_best"}
    store.close()


# --- refusals: one line, exit 2, nothing appended ---------------------------------------------------------------


def _waiting_and_done(url):
    store = Store(url)
    try:
        waiting_run(store)
        Trainer(fast(), store=store, run_id="done").train()
    finally:
        store.close()


@pytest.fixture
def waiting_db(tmp_path, run_templates):
    """Run `r` waiting for the review of step 1, run `done` completed (a copy of one built once per worker)."""
    db = run_templates.copy("review_waiting_and_done", _waiting_and_done, tmp_path / "w.db")
    store = Store(db)
    yield db, store
    store.close()


@pytest.mark.parametrize("args,message", [
    (["review", "nope", "--approve"], "unknown run 'nope'"),
    (["review", "done", "--approve"], "run done is not waiting for a review (it is completed)"),
    (["review", "done"], "run done is not waiting for a review"),
    (["review", "r", "--approve", "--step", "2"], "run r waits for a review of step 1, not step 2"),
    (["review", "r", "--reject", "--drop", "1"], "--drop leaves edits out of an approved candidate"),
    (["review", "r", "--approve", "--drop", "0"], "numbers of edits"),
    (["review", "r", "--approve", "--drop", "99"], "not distinct indices"),
    (["review", "r", "--approve", "--drop", "1,1"], "listed twice"),
    (["review", "r", "--approve", "--reviewer", "timeout"], "the review_timeout's"),
    (["review", "r", "--approve", "--reviewer", " "], "a reviewer's name"),
    (["review", "r", "--drop", "1"], "--drop goes with a decision"),
    (["review", "r", "--step", "3"], "step 3 of run r was not reviewed"),
])
def test_refusals_are_one_line_exit_2_and_append_nothing(waiting_db, args, message):
    db, store = waiting_db
    before = {rid: store.last_seq(rid) for rid in ("r", "done")}
    res = CliRunner().invoke(cli, [*args, "--db", db])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.output
    assert {rid: store.last_seq(rid) for rid in ("r", "done")} == before


def test_dropping_every_edit_is_a_reject_and_is_refused(waiting_db):
    db, store = waiting_db
    n = len(load_run(store, "r").state.progress.review.edits)
    res = call("review", "r", "--approve", "--drop", ",".join(str(i + 1) for i in range(n)), "--db", db, code=2)
    assert "that is a reject" in res.output or "leaves the skill as it was" in res.output
    assert of_type(store, "r", ReviewDecided) == []


def test_a_second_decision_is_refused_and_names_the_first(waiting_db):
    db, store = waiting_db
    call("review", "r", "--reject", "--reviewer", "alice", "--db", db)
    res = call("review", "r", "--approve", "--reviewer", "bob", "--db", db, code=2)
    assert "step 1 was decided by alice (reject)" in res.output
    assert len(of_type(store, "r", ReviewDecided)) == 1


def test_resuming_a_waiting_run_without_a_decision_stops_again_and_appends_nothing(waiting_db):
    db, store = waiting_db
    seq = store.last_seq("r")
    res = call("resume", "r", "--db", db, code=5)
    assert "step 1 of run r awaits review" in res.output
    assert store.last_seq("r") == seq


def test_the_reviewer_comes_from_the_environment_else_the_os_user(waiting_db, monkeypatch):
    db, store = waiting_db
    monkeypatch.setenv("SKILLSTATE_REVIEWER", "carol")
    call("review", "r", "--approve", "--db", db)
    assert of_type(store, "r", ReviewDecided)[0].reviewer == "carol"


def test_a_forged_decision_fails_the_audit(waiting_db):
    db, store = waiting_db
    loaded = load_run(store, "r")
    req = loaded.state.progress.review
    last = loaded.own[-1]
    forged = ReviewDecided(step=1, candidate="0" * 64, decision="approve", reviewer="mallory", at="2026-01-01")
    store.append("r", [forged], last_seq=last.seq, last_hash=last.hash)
    report = audit(store, "r")
    assert not report.ok and "does not answer its ReviewRequested" in report.problems[0]
    done = load_run(store, "done").own[-1]
    stray = ReviewDecided(step=1, candidate=req.candidate, decision="approve", reviewer="mallory", at="2026-01-01")
    store.append("done", [stray], last_seq=done.seq, last_hash=done.hash)
    problems = audit(store, "done").problems
    assert problems and "ReviewDecided" in problems[0] and "the fold fails" in problems[0]


# --- the race on one store: exactly one decision --------------------------------------------------------------


def test_two_reviewers_racing_on_one_step_record_exactly_one_decision(any_store):
    waiting_run(any_store)
    url = any_store.url
    gate = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def reviewer(name: str, decision: str) -> None:
        store = Store(url)
        real = store.append

        def append_after_both_read(*args, **kwargs):  # both have read the run waiting before either appends
            gate.wait(timeout=30)
            return real(*args, **kwargs)

        store.append = append_after_both_read
        try:
            outcomes[name] = decide(store, "r", decision, step=1, reviewer=name)
        except ReviewTaken as err:
            outcomes[name] = err
        finally:
            store.close()

    threads = [threading.Thread(target=reviewer, args=a) for a in (("alice", "approve"), ("bob", "reject"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    decided = of_type(any_store, "r", ReviewDecided)
    assert len(decided) == 1
    winner = decided[0].reviewer
    loser = "bob" if winner == "alice" else "alice"
    assert isinstance(outcomes[loser], ReviewTaken)
    assert f"was decided meanwhile by {winner}" in str(outcomes[loser])
    assert audit(any_store, "r").ok


# --- waiting without a person -----------------------------------------------------------------------------------


@pytest.mark.parametrize("default,decision", [("accept", "approve"), ("reject", "reject")])
def test_review_timeout_records_the_default_as_decided_by_timeout(tmp_path, default, decision):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    result = Trainer(fast(review="accepted", review_timeout=0, review_default=default), store=store,
                     run_id="r").train()
    assert result.state.completed
    decided = of_type(store, "r", ReviewDecided)
    assert decided and all(d.reviewer == "timeout" and d.decision == decision for d in decided)
    first = result.state.record(decided[0].step)
    assert ("by timeout (review_default)" in first.reason) and (first.decision == "reject") == (default == "reject")
    assert audit(store, "r").ok and verify(store, "r").ok
    store.close()


def test_a_driver_waiting_out_the_timeout_takes_a_reviewers_decision(tmp_path, monkeypatch):
    monkeypatch.setattr("skillstate.engine.review.POLL_SECONDS", 0.05)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = Store(url)
    done: dict[str, object] = {}
    lines: list[str] = []

    def drive() -> None:
        try:
            done["result"] = Trainer(fast(review="accepted", review_timeout=60), db=url, run_id="r",
                                     on_progress=lambda p: lines.append(p.stage) if p.kind == "notice" else None
                                     ).train()
        except Exception as err:  # noqa: BLE001  (reported below)
            done["error"] = err

    thread = threading.Thread(target=drive)
    thread.start()
    decided = 0
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            decide(store, "r", "approve", reviewer="alice")
            decided += 1
        except UserError:
            time.sleep(0.05)
    thread.join(60)
    assert "error" not in done, done.get("error")
    assert done["result"].state.completed and decided >= 1
    assert {d.reviewer for d in of_type(store, "r", ReviewDecided)} == {"alice"}
    assert any("awaits a decision until" in line for line in lines)
    assert audit(store, "r").ok and verify(store, "r").ok
    store.close()


def test_a_reviewer_who_gets_in_before_the_timeout_wins_the_race(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store, person = Store(url), Store(url)
    real = store.append

    def append(run_id, events, **kw):  # the person decides just as the driver records the timeout's
        if any(getattr(e, "reviewer", None) == "timeout" for e in events):
            decide(person, run_id, "reject", reviewer="alice")
        return real(run_id, events, **kw)

    store.append = append
    result = Trainer(fast(review="accepted", review_timeout=0, review_default="accept"), store=store,
                     run_id="r").train()
    assert result.state.completed
    assert {d.reviewer for d in of_type(store, "r", ReviewDecided)} == {"alice"}
    assert audit(store, "r").ok and verify(store, "r").ok
    person.close()
    store.close()


def test_review_timeout_and_default_may_change_on_resume(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    waiting_run(store)
    runtime = stored_config({**dict(load_run(store, "r").state.config), "review_timeout": 0,
                             "review_default": "accept"})
    result = Trainer(runtime, store=store, run_id="r").train()
    assert result.state.completed
    assert {d.reviewer for d in of_type(store, "r", ReviewDecided)} == {"timeout"}
    assert verify(store, "r").ok
    with pytest.raises(UserError, match="review="):  # review itself is the run's: a fork changes it
        Trainer(stored_config({**dict(load_run(store, "r").state.config), "review": "all"}), store=store,
                run_id="r").prepare()
    store.close()


# --- forks and old logs -----------------------------------------------------------------------------------------


def test_a_fork_from_before_a_review_decides_again(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    waiting_run(store)
    decide(store, "r", "approve", dropped=[0], reviewer="alice")
    finish(store, "r")
    child = Trainer(store=store, run_id="r").fork(0, new_run_id="f")
    with pytest.raises(ReviewPending):
        child.train()
    parent_request = of_type(store, "r", ReviewRequested)[0]
    fork_request = load_run(store, "f").state.progress.review
    assert fork_request.candidate == parent_request.candidate  # the same step, served from the journal
    decide(store, "f", "reject", reviewer="bob")
    finish(store, "f")
    assert load_run(store, "f").state.record(1).decision == "reject"
    assert load_run(store, "r").state.record(1).decision.startswith("accept")
    for rid in ("r", "f"):
        assert audit(store, rid).ok and verify(store, rid).ok
    off = Trainer(store=store, run_id="r").fork(1, {"review": "off"}, new_run_id="g").train()  # inherits step 1's
    assert off.state.completed and of_type(store, "g", ReviewRequested) == []
    assert audit(store, "g").ok and verify(store, "g").ok
    store.close()


def test_a_log_written_before_review_existed_reads_as_review_off(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    Trainer(fast(), store=store, run_id="new").train()
    events = [s.event for s in store.read_events("new")]
    started = events[0]
    old = {k: v for k, v in started.config.items() if not k.startswith("review")}
    events[0] = started.model_copy(update={"config": old})
    store.append("old", events, last_seq=0, last_hash="0" * 64,
                 new_run={"parent_run_id": None, "fork_step": None, "kind": "train"})
    state = load_run(store, "old").state
    assert "review" not in state.config and stored_config(dict(state.config)).review == "off"
    assert status_of(state) == "completed"
    assert audit(store, "old").ok and verify(store, "old").ok
    store.close()


def test_review_is_refused_in_mode_bank():
    from skillstate.config_views import validate_config
    from skillstate.errors import ConfigError

    with pytest.raises(ConfigError, match="review does not apply"):
        validate_config({"mode": "bank", "review": "accepted"})
    assert validate_config({"review": False}).review == "off"  # --set review=off reads as YAML's false
