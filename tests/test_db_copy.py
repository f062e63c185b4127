"""`skillstate db copy`: runs with their fork ancestors, blobs and calls between
databases, byte for byte, audited at the destination.

SQLite to SQLite always; SQLite to PostgreSQL and back when
$SKILLSTATE_TEST_PG_URL is set (a fresh schema per database, in a session
time zone other than UTC, so a timestamp that lost its zone would show).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import PG_ENV, Crash, Databases, crashing_factory, small_config
from sqlalchemy import func, select

from skillstate.cli.main import cli
from skillstate.exports.db_copy import copy_runs
from skillstate.reading.audit import audit, verify
from skillstate.storage.schema import blobs, events, llm_calls, runs
from skillstate.storage.store import Store
from skillstate.trainer import Trainer, evaluate_skill

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "sweep_driver.py"
PG_BASE = os.environ.get(PG_ENV)
needs_pg = pytest.mark.skipif(not PG_BASE, reason=f"{PG_ENV} is not set")
CONFIG = dict(num_epochs=1)  # 3 steps
FORK_OVERRIDES = {"lr_scheduler": "linear", "edit_budget": 2}


@pytest.fixture
def dbs(tmp_path):
    d = Databases(tmp_path, "sqlite", "Asia/Tokyo")
    yield d
    d.drop()


def build_source(path: Path) -> str:
    """A run, a fork of it at step 1 and an evaluation run of its best skill."""
    url = f"sqlite:///{path}"
    store = Store(url)
    try:
        trainer = Trainer(small_config(**CONFIG), store=store, run_id="base")
        result = trainer.train()
        trainer.fork(1, FORK_OVERRIDES, new_run_id="kid").train()
        skill = path.parent / "best.md"
        skill.write_text(result.best_skill)
        evaluate_skill(small_config(**CONFIG, initial_skill=str(skill)), "test", store=store, run_id="ev")
    finally:
        store.close()
    return url


@pytest.fixture(scope="module")
def source_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("copy_src") / "src.db"
    build_source(path)
    return path


@pytest.fixture
def source(source_file, tmp_path) -> str:
    """A private copy of the source database (tests may grow it)."""
    path = tmp_path / "src.db"
    shutil.copy(source_file, path)
    return f"sqlite:///{path}"


def counts(url: str) -> dict[str, int]:
    s = Store(url, upgrade=False)
    try:
        with s.engine.connect() as conn:
            return {t.name: int(conn.execute(select(func.count()).select_from(t)).scalar() or 0)
                    for t in (runs, events, blobs, llm_calls)}
    finally:
        s.close()


def rows(store: Store, run_id: str) -> list[tuple]:
    import datetime as dt

    def utc(v):
        return v.replace(tzinfo=dt.timezone.utc) if v.tzinfo is None else v.astimezone(dt.timezone.utc)

    return [(s.seq, s.type, s.version, s.payload, s.prev_hash, s.hash, s.mac, utc(s.created_at))
            for s in store.read_events(run_id)]


def sent_hashes(store: Store, run_id: str) -> set[str]:
    return {c.request_hash for c in store.read_calls(run_id)}


def all_request_hashes(store: Store) -> set[str]:
    with store.engine.connect() as conn:
        return {r[0] for r in conn.execute(select(llm_calls.c.request_hash))}


def db_copy(*args: str):
    return CliRunner().invoke(cli, ["db", "copy", *args])


def one_line_error(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    for needle in needles:
        assert needle in lines[0], res.output


def check_copied(src_url: str, dst_url: str, run_ids=("base", "kid", "ev")) -> None:
    """Byte-equal events, audit and verify at the destination."""
    src, dst = Store(src_url), Store(dst_url)
    try:
        for run_id in run_ids:
            assert rows(dst, run_id) == rows(src, run_id)
            assert dst.get_run(run_id) is not None
            assert (dst.get_run(run_id).parent_run_id, dst.get_run(run_id).kind) == (
                src.get_run(run_id).parent_run_id, src.get_run(run_id).kind)
            report = audit(dst, run_id)
            assert report.ok, report.problems
            checked = verify(dst, run_id)
            assert checked.ok and checked.checked == len(rows(src, run_id)), checked.divergence
            # the trajectories a results blob names came along too (audit does not look inside results)
            for s in dst.read_events(run_id):
                results = getattr(s.event, "results", None)
                if isinstance(results, str):
                    items = json.loads(dst.get_blob(results))
                    named = [i["trajectory"] for i in items if isinstance(i, dict) and i.get("trajectory")]
                    assert len(dst.get_blobs(named)) == len(set(named))
    finally:
        src.close()
        dst.close()


# --- SQLite to SQLite ---------------------------------------------------------------------------------------


def test_copy_a_run_a_fork_and_an_eval_run(source, dbs):
    dst = dbs.new()
    res = db_copy("--from", source, "--to", dst, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["ok"] and [r["run_id"] for r in report["runs"]] == ["base", "kid", "ev"]
    assert {r["status"] for r in report["runs"]} == {"copied"}
    assert all(r["audit_ok"] for r in report["runs"])
    check_copied(source, dst)


def test_copying_a_fork_brings_its_parent_first(source, dbs):
    dst = dbs.new()
    res = db_copy("--from", source, "--to", dst, "kid")
    assert res.exit_code == 0, res.output
    assert "base: copied" in res.output and "a fork ancestor" in res.output
    assert res.output.index("base:") < res.output.index("kid:")
    check_copied(source, dst, ("base", "kid"))
    assert counts(dst)["runs"] == 2


def test_copying_twice_is_a_no_op(source, dbs):
    dst = dbs.new()
    assert db_copy("--from", source, "--to", dst).exit_code == 0
    before = counts(dst)
    res = db_copy("--from", source, "--to", dst, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert [r["status"] for r in report["runs"]] == ["already there"] * 3
    assert report["events_copied"] == report["calls_copied"] == report["blobs_copied"] == 0
    assert counts(dst) == before
    check_copied(source, dst)


def test_a_run_served_from_another_runs_calls_verifies_alone(tmp_path, dbs):
    """Under llm_cache all, run b was served a's calls: copying b alone brings the rows it needs."""
    src = f"sqlite:///{tmp_path / 'two.db'}"
    store = Store(src)
    try:
        Trainer(small_config(**CONFIG), store=store, run_id="a").train()
        Trainer(small_config(**CONFIG), store=store, run_id="b").train()
        assert len(sent_hashes(store, "b")) < len(sent_hashes(store, "a")) / 10  # b paid for almost nothing
    finally:
        store.close()
    dst = dbs.new()
    res = db_copy("--from", src, "--to", dst, "b")
    assert res.exit_code == 0, res.output
    check_copied(src, dst, ("b",))
    assert counts(dst)["runs"] == 1


def partial_run(url: str, run_id: str = "p", after_calls: int = 150) -> None:
    """A run that died mid-way (its driver crashed after `after_calls` requests)."""
    store = Store(url)
    try:
        with pytest.raises(Crash):
            Trainer(small_config(**CONFIG), store=store, run_id=run_id,
                    backend_factory=crashing_factory(after_calls)).train()
    finally:
        store.close()


def finish(url: str, run_id: str = "p") -> None:
    store = Store(url)
    try:
        Trainer(small_config(**CONFIG), store=store, run_id=run_id).train()
    finally:
        store.close()


def test_a_grown_source_run_gets_only_its_new_events(tmp_path, dbs):
    src = f"sqlite:///{tmp_path / 'grow.db'}"
    partial_run(src)
    dst = dbs.new()
    first = json.loads(db_copy("--from", src, "--to", dst, "--json").output)
    n = first["runs"][0]["events_copied"]
    assert first["runs"][0]["status"] == "copied" and 0 < n < 49
    finish(src)
    res = db_copy("--from", src, "--to", dst, "--json")
    assert res.exit_code == 0, res.output
    again = json.loads(res.output)["runs"][0]
    assert again["status"] == "appended" and again["events_copied"] == again["events"] - n == 49 - n
    assert again["audit_ok"]
    check_copied(src, dst, ("p",))


def test_resuming_and_forking_at_the_destination_send_nothing_already_journaled(tmp_path, dbs):
    src = f"sqlite:///{tmp_path / 'res.db'}"
    partial_run(src)
    dst = dbs.new()
    assert db_copy("--from", src, "--to", dst).exit_code == 0
    d = Store(dst)
    try:
        journaled = all_request_hashes(d)
        own_before = len(d.read_calls("p"))
        Trainer(small_config(**CONFIG), store=d, run_id="p").train()
        new = {c.request_hash for c in d.read_calls("p")[own_before:]}
        assert new and not new & journaled  # it paid only for what the crashed driver had not sent
        assert audit(d, "p").ok
        journaled = all_request_hashes(d)
        Trainer(store=d, run_id="p").fork(1, FORK_OVERRIDES, new_run_id="p2").train()
        assert not sent_hashes(d, "p2") & journaled
    finally:
        d.close()
    finish(src)  # the same run finished at the source: the same log
    s, d = Store(src), Store(dst)
    try:
        assert [(e.type, e.payload, e.hash) for e in d.read_events("p")] == \
            [(e.type, e.payload, e.hash) for e in s.read_events("p")]
    finally:
        s.close()
        d.close()


def test_a_run_with_a_different_log_there_is_refused_and_nothing_is_written(source, dbs, tmp_path):
    dst = dbs.new()
    store = Store(dst)
    try:  # another "base" at the destination: same id, another config
        Trainer(small_config(num_epochs=1, seed=7), store=store, run_id="base").train()
    finally:
        store.close()
    before = counts(dst)
    for args in (["base"], [], ["ev", "kid"]):  # kid needs base: refused too, and ev is not copied either
        res = db_copy("--from", source, "--to", dst, *args)
        one_line_error(res, "run 'base' exists in", "with a different log", "nothing was copied")
        assert counts(dst) == before
    # a destination log longer than the source's is not a prefix either
    partial = tmp_path / "partial.db"
    partial_run(f"sqlite:///{partial}", run_id="base", after_calls=100)
    res = db_copy("--from", f"sqlite:///{partial}", "--to", dst)
    one_line_error(res, "different log")


def test_unknown_run_bad_urls_and_the_same_database_are_one_line(source, tmp_path):
    dst = f"sqlite:///{tmp_path / 'never.db'}"
    one_line_error(db_copy("--from", source, "--to", dst, "nope"), "unknown run 'nope'", "nothing was copied")
    one_line_error(db_copy("--from", "nonsense", "--to", dst), "not a database URL")
    one_line_error(db_copy("--from", source, "--to", "mysql+nodriver://x/y"), "cannot use database")
    one_line_error(db_copy("--from", f"sqlite:///{tmp_path / 'missing.db'}", "--to", dst), "no database at")
    one_line_error(db_copy("--from", source, "--to", source), "same database")
    assert not (tmp_path / "never.db").exists()  # nothing was created for a copy that could not start


def test_the_library_call_reports_what_it_did(source, dbs):
    src, dst = Store(source), Store(dbs.new())
    try:
        seen = []
        report = copy_runs(src, dst, ["ev"], on_run=seen.append)
        assert [r.run_id for r in report.runs] == [r.run_id for r in seen] == ["ev"]
        assert report.ok and report.runs[0].calls_copied > 0 and report.runs[0].blobs_copied > 0
    finally:
        src.close()
        dst.close()


def test_a_run_being_driven_is_copied_up_to_its_last_committed_event(tmp_path, dbs):
    """The driver is paused holding the lease at the source: a consistent snapshot is copied."""
    src = f"sqlite:///{tmp_path / 'live.db'}"
    marker, release = tmp_path / "live.marker", tmp_path / "live.release"
    env = {**os.environ, "SWEEP_PAUSE_EVENTS": "15", "SWEEP_MARKER": str(marker), "SWEEP_RELEASE": str(release)}
    proc = subprocess.Popen([sys.executable, str(DRIVER), "run", "--run-id", "live", "--epochs", "1", "-q",
                             "--db", src], cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.02)
        dst = dbs.new()
        res = db_copy("--from", src, "--to", dst, "--json")
        assert res.exit_code == 0, res.output
        run = json.loads(res.output)["runs"][0]
        assert run["driven"] and run["status"] == "copied" and run["events_copied"] == 15 and run["audit_ok"]
        release.write_text("go")
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    res = db_copy("--from", src, "--to", dst, "--json")
    run = json.loads(res.output)["runs"][0]
    assert run["status"] == "appended" and run["events"] == 50 and not run["driven"]  # 3 steps on every default
    check_copied(src, dst, ("live",))


# --- PostgreSQL ---------------------------------------------------------------------------------------------


@needs_pg
def test_sqlite_to_postgresql_and_back(source, dbs, tmp_path):
    pg = dbs.new("postgresql")
    res = db_copy("--from", source, "--to", pg)
    assert res.exit_code == 0, res.output
    check_copied(source, pg)
    back = f"sqlite:///{tmp_path / 'back.db'}"
    res = db_copy("--from", pg, "--to", back, "--json")
    assert res.exit_code == 0, res.output
    check_copied(pg, back)
    # idempotent both ways
    again = json.loads(db_copy("--from", back, "--to", pg, "--json").output)
    assert [r["status"] for r in again["runs"]] == ["already there"] * 3
    # resuming at PostgreSQL after a copy of a crashed run pays nothing twice
    crashed = f"sqlite:///{tmp_path / 'crashed.db'}"
    partial_run(crashed)
    assert db_copy("--from", crashed, "--to", pg, "p").exit_code == 0
    d = Store(pg)
    try:
        journaled, own_before = all_request_hashes(d), len(d.read_calls("p"))
        Trainer(small_config(**CONFIG), store=d, run_id="p").train()
        assert not {c.request_hash for c in d.read_calls("p")[own_before:]} & journaled
        assert audit(d, "p").ok
    finally:
        d.close()


@needs_pg
def test_postgresql_refusals_and_no_password_in_the_output(source, dbs):
    pg = dbs.new("postgresql")
    secret_url = pg.replace("postgresql+psycopg://postgres@", "postgresql+psycopg://postgres:sekrit-pw@")
    res = db_copy("--from", source, "--to", secret_url, "base")
    assert res.exit_code == 0 and "sekrit-pw" not in res.output and "***" in res.output, res.output
    res = db_copy("--from", source, "--to", secret_url, "base", "--json")
    assert res.exit_code == 0 and "sekrit-pw" not in res.output
    store = Store(pg)
    try:
        Trainer(small_config(num_epochs=1, seed=7), store=store, run_id="ev").train()  # a different "ev"
    finally:
        store.close()
    before = counts(pg)
    res = db_copy("--from", source, "--to", secret_url)
    one_line_error(res, "run 'ev' exists in", "different log")
    assert "sekrit-pw" not in res.output and counts(pg) == before
    one_line_error(db_copy("--from", source, "--to", secret_url, "ghost"), "unknown run 'ghost'")
    bad = secret_url.replace("127.0.0.1:5432", "127.0.0.1:1")
    res = db_copy("--from", source, "--to", bad)
    one_line_error(res, "cannot open database")
    assert "sekrit-pw" not in res.output
