"""The hostile-agent suite (issue 39): tests/hostile_agent.py, run by the `command` harness through the proxy in
the sandbox, tries every escape that once got through, and fakes its task's check. Nothing may get out, the
faked check must fail, and the run must go on to a completed, audited, verified log that holds no secret.
`.ci/run` runs it as root, where the sandbox drops to an unprivileged user first. Its run takes about 40 s, so it
is in the slow suite (.ci/run runs that too); tests/test_sandbox_escapes.py keeps the escapes in the default one."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import small_config

from skillstate.envs.workspace.sandbox_view import python_roots
from skillstate.envs.workspace.tasks import bundled_splits
from skillstate.reading.audit import audit, verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (.ci/run installs it)"),
              pytest.mark.slow]
AGENT = Path(__file__).resolve().parent / "hostile_agent.py"
MARKER = "HOSTILE-MARKER-7f3a"
KEY = "az0HostileTestKey0123456789abcdef"  # no sk- prefix: redaction must know it by its value


def unix_sockets() -> list[str]:
    with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return sorted({r[7] for r in rows if len(r) > 7 and r[7].startswith("/") and not r[7].startswith("/tmp/")})[:5]


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    project, home = folder / "project", folder / "home"
    project.mkdir()
    home.mkdir()
    (project / "notes.txt").write_text(MARKER)
    (home / "notes.txt").write_text(MARKER)
    data = folder / "data"
    data.mkdir()
    splits = bundled_splits(["train", "val", "test"]).values()
    money = [i for items in splits for i in items if i["task_type"] == "money"]
    for split, item in zip(("train", "val", "test"), money, strict=False):
        (data / f"{split}.jsonl").write_text(json.dumps({**item, "note": MARKER}) + "\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    db = folder / "runs.db"
    config_file = folder / "run.yaml"
    config_file.write_text(f"# {MARKER}\n")
    targets = {"marker": MARKER, "key": KEY,
               "secret_files": [str(db), str(data / "val.jsonl"), str(data / "test.jsonl"), str(config_file),
                                str(project / "notes.txt"), str(home / "notes.txt")],
               "secret_dirs": [str(folder), "/root", "/home", "/var/lib", "/run", str(Path.cwd())],
               # the harness shows the files its command names, and the Python at its own path: the folders on
               # the way to them are there, holding them alone
               "shown_names": ["targets.json",
                               *{part for p in [*python_roots(), str(AGENT)] for part in Path(p).parts}],
               "host_paths": [str(data), str(project), str(home), *(["skillstate-ws-"] if os.geteuid() == 0 else [])],
               "ports": [["127.0.0.1", 5432], ["127.0.0.1", server.server_address[1]]], "sockets": unix_sockets()}
    (folder / "targets.json").write_text(json.dumps(targets))
    from skillstate.envs.run_paths import name_run_paths

    name_run_paths([config_file])  # as `--config` names it
    config = small_config(env="workspace", data=str(data), batch_size=1, num_epochs=1, concurrency=1,
                          env_config={"sandbox": {"tmp_mb": 64},
                                      "harness": {"kind": "command", "wall_seconds": 120,
                                                  "command": [sys.executable, str(AGENT), str(folder / "targets.json"),
                                                              "{task}"]}})
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    old = {k: os.environ.get(k) for k in ("OPENAI_API_KEY", "HOME")}
    os.environ.update(OPENAI_API_KEY=KEY, HOME=str(home))
    cwd = os.getcwd()
    os.chdir(project)
    peak, done = [threading.active_count()], threading.Event()

    def count_threads() -> None:
        while not done.wait(0.05):
            peak.append(threading.active_count())

    threading.Thread(target=count_threads, daemon=True).start()
    said, sys.stderr = sys.stderr, io.StringIO()  # what the driver's threads print (a traceback, say)
    try:
        store = Store(f"sqlite:///{db}")
        Trainer(config, store=store, run_id="hostile").train()
    finally:
        printed, sys.stderr = sys.stderr.getvalue(), said
        done.set()
        os.chdir(cwd)
        server.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    return SimpleNamespace(store=store, db=db, peak_threads=max(peak), printed=printed)


def trajectories(store: Store, run_id: str) -> list[dict]:
    from skillstate.engine.loading import load_run

    return [json.loads(store.get_blob(r.trajectory)) for s in load_run(store, run_id).own
            for r in getattr(s.event, "results", None) or [] if getattr(r, "trajectory", None)]


def test_the_hostile_agent_escapes_nothing(hostile_run):
    store = hostile_run.store
    trajs = trajectories(store, "hostile")
    probes = [e for t in trajs for e in t["events"] if isinstance(e, dict) and "probe" in e]
    assert len({p["probe"] for p in probes}) >= 20, [t["log"] for t in trajs]
    escaped = [p for p in probes if p["escaped"]]
    assert not escaped, escaped
    assert not any(p["probe"].startswith("probe crashed") for p in probes), probes
    assert sum(p["probe"] == "model call" for p in probes) == 2 * len(trajs)  # before the probes and after


def test_the_driver_stays_bounded_and_quiet_whatever_the_agent_sends(hostile_run):
    assert hostile_run.peak_threads < 120, hostile_run.peak_threads  # 400 idle connections were held
    assert "Traceback" not in hostile_run.printed, hostile_run.printed[-2000:]


def test_its_faked_check_fails_and_verification_agrees(hostile_run):
    store = hostile_run.store
    trajs = trajectories(store, "hostile")
    assert trajs and all(not t["success"] for t in trajs)
    assert all("no report" in t["check"].get("report", "") for t in trajs), [t["check"] for t in trajs]
    assert audit(store, "hostile").ok and verify(store, "hostile").ok


def test_the_run_went_on_and_holds_no_secret(hostile_run):
    store, db = hostile_run.store, hostile_run.db
    from skillstate.engine.loading import load_run

    assert load_run(store, "hostile").state.completed
    for path in (db, Path(str(db) + "-wal")):
        assert not path.exists() or KEY.encode() not in path.read_bytes()
