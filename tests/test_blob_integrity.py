"""Blobs are checked before anything is built on them (issue 20, section 2).

A blob an event names, or a trajectory named only inside a results blob, that
is missing, altered, truncated or bit-flipped: resume, run with the run's id
and fork refuse in one line naming the event and the blob, and append
nothing; audit and replay --verify name it the same way; no command shows a
zlib traceback.
"""

from __future__ import annotations

import shutil
import zlib

import pytest
from click.testing import CliRunner
from conftest import Crash, Databases, crashing_factory, small_config
from sqlalchemy import delete, func, select, update
from starlette.testclient import TestClient

from skillstate.cli.main import cli
from skillstate.dashboard.app import create_app
from skillstate.dashboard.store_view import open_read_only
from skillstate.errors import CorruptLogError
from skillstate.reading.audit import audit, head, verify
from skillstate.storage.blob_walk import trajectories_in
from skillstate.storage.store import Store, blobs, llm_calls, runs
from skillstate.trainer import Trainer

DAMAGE = ["missing", "altered", "truncated", "bit-flipped"]
# what the refusal says of the blob, per kind of damage
SAYS = {"missing": "is missing", "altered": "does not match its hash", "truncated": "cannot be decompressed",
        "bit-flipped": "cannot be decompressed"}
EDIT = "\nAlways answer 42.\n"  # what "altered" appends to the blob's text


def incomplete_run(url: str) -> None:
    """Run `r` dies after 150 LLM calls: its log holds the baseline and part of step 1 (overlap_start off: with
    it, the work done ahead while the baseline is scored may take the 150 calls before the baseline is in)."""
    store = Store(url)
    try:
        with pytest.raises(Crash):
            Trainer(small_config(num_epochs=1, overlap_start=False), store=store, run_id="r",
                    backend_factory=crashing_factory(150)).train()
    finally:
        store.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("blobs") / "template.db"
    incomplete_run(f"sqlite:///{path}")
    return path


@pytest.fixture
def db(template, tmp_path):
    path = tmp_path / "r.db"
    if template.exists():
        shutil.copy(template, path)
    else:  # pytest removed old temporary directories (another session on this machine): build it again
        incomplete_run(f"sqlite:///{path}")
    return f"sqlite:///{path}"


def target(store: Store, which: str) -> tuple[int, str, str, str]:
    """(seq, event type, blob hash, the results blob naming it or "") of the blob to damage:
    the initial skill (named by RunStarted), or a baseline trajectory named only inside the
    baseline's results blob."""
    stored = store.read_events("r")
    first = stored[0]
    if which == "skill":
        return first.seq, first.type, first.event.initial_skill, ""
    direct = {h for s in stored for h in s.event.blob_refs()}
    (base,) = [s for s in stored if s.type == "BaselineEvaluated"]
    nested = [h for h in trajectories_in(store.get_blob(base.event.results)) if h not in direct]
    return base.seq, base.type, nested[len(nested) // 2], base.event.results


def damage(store: Store, blob_hash: str, how: str) -> None:
    with store.engine.begin() as conn:
        data = bytes(conn.execute(select(blobs.c.data).where(blobs.c.hash == blob_hash)).scalar_one())
        where = blobs.c.hash == blob_hash
        if how == "missing":
            conn.execute(delete(blobs).where(where))
        elif how == "altered":  # valid data, another text: what a user editing the row would leave
            text = zlib.decompress(data).decode("utf-8")
            conn.execute(update(blobs).where(where).values(data=zlib.compress((text + EDIT).encode())))
        elif how == "truncated":
            conn.execute(update(blobs).where(where).values(data=data[: len(data) // 2]))
        elif how == "bit-flipped":
            i = len(data) // 2
            conn.execute(update(blobs).where(where).values(data=data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:]))
        else:
            raise ValueError(how)
    store._blob_cache.clear()


def log_state(store: Store) -> tuple[object, ...]:
    """What must not change when a command is refused: the head, the runs and the calls."""
    with store.engine.connect() as conn:
        n_runs = conn.execute(select(func.count()).select_from(runs)).scalar()
        n_calls = conn.execute(select(func.count()).select_from(llm_calls)).scalar()
    return str(head(store, "r")), n_runs, n_calls


def one_line(res) -> str:
    assert isinstance(res.exception, SystemExit), (res.exception, res.output)  # handled: no traceback
    assert "Traceback" not in res.output and "zlib" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    return lines[0]


def refuses(url: str, args: list[str], names: list[str], code: int = 1) -> None:
    res = CliRunner().invoke(cli, [*args, "--db", url])
    assert res.exit_code == code, (args, res.output)
    line = one_line(res)
    for part in names:
        assert part in line, (args, line)


REFUSING = [["resume", "r", "-q"], ["run", "--run-id", "r", "-q"], ["fork", "r", "0", "--run-id", "kid", "-q"],
            ["replay", "r", "--verify"], ["audit", "r"]]


def check_refused(url: str, which: str, how: str) -> None:
    store = Store(url)
    try:
        seq, type_name, h, inside = target(store, which)
        damage(store, h, how)
        before = log_state(store)
        names = [f"run r event {seq} ({type_name}): blob {h[:12]}", SAYS[how]]
        if inside:
            names.append(f"named in blob {inside[:12]}")
        for args in REFUSING:
            refuses(url, args, names)
            assert log_state(store) == before, args  # nothing appended, no run created, nothing sent
        report = audit(store, "r")
        assert not report.ok and all(p in report.problems[0] for p in names)
        with pytest.raises(CorruptLogError, match=names[0].replace("(", r"\(").replace(")", r"\)")):
            verify(store, "r")
    finally:
        store.close()


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("which", ["skill", "trajectory"])
def test_a_damaged_blob_is_refused_before_anything_is_appended(db, which, how):
    check_refused(db, which, how)


@pytest.mark.parametrize("how", DAMAGE)
def test_postgresql_refuses_a_damaged_trajectory_too(tmp_path, how):
    dbs = Databases(tmp_path, default="postgresql")
    try:
        url = dbs.new()
        incomplete_run(url)
        check_refused(url, "trajectory", how)
    finally:
        dbs.drop()


def test_an_edited_initial_skill_is_not_scored(db):
    """The issue's example: the edited skill is never rolled out, the run resumes once it is restored."""
    store = Store(db)
    try:
        _, _, h, _ = target(store, "skill")
        with store.engine.connect() as conn:
            original = bytes(conn.execute(select(blobs.c.data).where(blobs.c.hash == h)).scalar_one())
        damage(store, h, "altered")
        refuses(db, ["resume", "r", "-q"], ["event 1 (RunStarted)", h[:12], "does not match its hash"])
        with store.engine.begin() as conn:
            conn.execute(update(blobs).where(blobs.c.hash == h).values(data=original))
        assert CliRunner().invoke(cli, ["resume", "r", "-q", "--db", db]).exit_code == 0
        assert audit(store, "r").ok and verify(store, "r").ok
    finally:
        store.close()


@pytest.mark.parametrize("how", DAMAGE)
def test_reading_commands_and_the_dashboard_do_not_traceback(db, how):
    """A read that needs the damaged blob names it in one line (exit 1, like a damaged event) and never
    shows an altered text; the others work."""
    store = Store(db)
    try:
        _, _, skill, _ = target(store, "skill")
        damage(store, skill, how)
    finally:
        store.close()
    failed = []
    for args in (["show", "r"], ["replay", "r", "--to-step", "0"], ["export", "r", "--step", "0"], ["log", "r"],
                 ["runs"], ["why", "r", "answer"]):
        res = CliRunner().invoke(cli, [*args, "--db", db])
        failed += [args[0]] if res.exit_code else []
        assert "Always answer 42" not in res.output, args
        if res.exit_code != 0:  # a command that reads the blob names it; one that does not works
            line = one_line(res)
            assert res.exit_code == 1 and skill[:12] in line and SAYS[how] in line, (args, line)
    assert {"replay", "export"} <= set(failed), failed  # both print the skill
    reader = open_read_only(db)
    try:
        client = TestClient(create_app(reader))
        statuses = {}
        for path in ("/", "/runs/r", "/runs/r/skill", "/runs/r/steps/1", "/api/runs/r"):
            page = client.get(path)
            statuses[path] = page.status_code
            assert page.status_code in (200, 500), (path, page.status_code)
            assert "Traceback" not in page.text and "zlib.error" not in page.text, path
            assert "Always answer 42" not in page.text, path
            if page.status_code == 500:  # the error page names the blob
                assert skill[:12] in page.text and SAYS[how] in page.text, (path, page.text[:2000])
        assert statuses["/runs/r/skill"] == 500, statuses
    finally:
        reader.close()


def test_an_intact_run_passes_the_blob_check_resumes_and_audits_clean(db):
    """No false alarm: the blob check lets an intact run resume, and it still audits clean after."""
    store = Store(db)
    try:
        assert audit(store, "r").ok
        assert CliRunner().invoke(cli, ["resume", "r", "-q", "--db", db]).exit_code == 0
        assert audit(store, "r").ok
    finally:
        store.close()


@pytest.mark.parametrize("how", ["truncated", "bit-flipped"])
def test_db_copy_copies_a_damaged_blob_as_stored_and_names_it(db, tmp_path, how):
    """db copy walks blobs with the same walker: a damaged one is no traceback; the audit there names it."""
    store = Store(db)
    try:
        seq, type_name, h, inside = target(store, "trajectory")
        damage(store, h, how)
    finally:
        store.close()
    res = CliRunner().invoke(cli, ["db", "copy", "--from", db, "--to", f"sqlite:///{tmp_path / 'to.db'}"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"run r event {seq} ({type_name}): blob {h[:12]} (named in blob {inside[:12]})" in res.output
    assert "cannot be decompressed" in res.output
