"""Shared fixtures: databases (SQLite always, PostgreSQL when
$SKILLSTATE_TEST_PG_URL is set), small sim runs, the local OpenAI-compatible
sim server."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

# Bytecode caches, whatever PYTHONDONTWRITEBYTECODE says: without them every test module's asserts are rewritten
# again on each run and in each worker, and every `skillstate` process a test starts compiles the package from
# source (the rewrite alone took 5 of the 12 s each worker spent collecting). The caches sit in __pycache__.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# (imported after the bytecode setting above, so that their caches are written)
from skillstate.config import SkillConfig  # noqa: E402
from skillstate.sim.server import SimServer  # noqa: E402
from skillstate.sim.world import SimWorld, bundled_splits  # noqa: E402
from skillstate.storage.store import Store  # noqa: E402
from skillstate.trainer import Trainer  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PG_ENV = "SKILLSTATE_TEST_PG_URL"

# A small but complete run: 2 epochs of 3 steps on the bundled sim world. The mechanisms against lines that block
# a task type (the blocker search, the prune, the minibatch screen) are on by default; these runs leave them (and
# the prune's test of the lowest type) off, so each other mechanism's tests see the loop they were written for,
# and the mechanisms' own tests (and the tests of the defaults) turn them on.
SMALL = dict(num_epochs=2, batch_size=40, seed=42, blocker_search="off", prune="off", prune_blockers=False,
             edit_screen="off")
# small_config(**DEFAULT_LOOP): those mechanisms as the defaults have them
DEFAULT_LOOP = {key: SkillConfig.model_fields[key].default for key in ("blocker_search", "prune", "prune_blockers",
                                                                    "edit_screen")}


def small_config(**kw) -> SkillConfig:
    return SkillConfig(**{**SMALL, **kw})


@pytest.fixture
def db_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture
def store(db_url) -> Store:
    s = Store(db_url)
    yield s
    s.close()


def _pg_schema_url(base: str) -> tuple[str, str]:
    schema = f"t_{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in base else "?"
    return schema, f"{base}{sep}options=-csearch_path%3D{schema}"


def new_pg_schema(base: str) -> tuple[str, str]:
    """A fresh, empty schema on the server at `base`: (its name, a URL whose search path is it)."""
    from sqlalchemy import create_engine, text

    schema, url = _pg_schema_url(base)
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    return schema, url


def drop_pg_schemas(base: str, schemas: list[str]) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(base)
    with admin.begin() as conn:
        for schema in schemas:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request, tmp_path):
    """The same tests against every storage backend."""
    if request.param == "sqlite":
        s = Store(f"sqlite:///{tmp_path / 'any.db'}")
        yield s
        s.close()
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set")
    schema, url = new_pg_schema(base)
    s = Store(url)
    yield s
    s.close()
    drop_pg_schemas(base, [schema])


class Databases:
    """Fresh databases for one test: SQLite files in its tmp_path, or new
    PostgreSQL schemas (skipped without $SKILLSTATE_TEST_PG_URL), dropped after."""

    def __init__(self, tmp_path: Path, default: str = "sqlite", pg_timezone: str | None = None):
        self.tmp_path, self.default, self.pg_timezone = tmp_path, default, pg_timezone
        self.schemas: list[str] = []
        self.n = 0

    def new(self, kind: str | None = None) -> str:
        self.n += 1
        if (kind or self.default) == "sqlite":
            return f"sqlite:///{self.tmp_path / f'db{self.n}.db'}"
        base = os.environ.get(PG_ENV)
        if not base:
            pytest.skip(f"{PG_ENV} is not set")
        schema, url = new_pg_schema(base)
        self.schemas.append(schema)
        if self.pg_timezone:  # a session whose clock is not UTC
            url = url.replace("search_path%3D", f"timezone%3D{self.pg_timezone}%20-csearch_path%3D")
        return url

    def drop(self) -> None:
        base = os.environ.get(PG_ENV)
        if self.schemas and base:
            drop_pg_schemas(base, self.schemas)


SLOW_ENV = "SKILLSTATE_SLOW"


def examples(full: int, sampled: int):
    """A property test's budget, as its parameter `max_examples`: `sampled` examples in the default suite
    ([sampled]), all `full` of them in the slow suite ([full] carries the slow marker). The test builds its
    @given check inside, with @settings(max_examples=max_examples)."""
    return pytest.mark.parametrize("max_examples", [pytest.param(sampled, id="sampled"),
                                                    pytest.param(full, id="full", marks=pytest.mark.slow)])


def slow_case(*values, **kw):
    """One case of a sweep that only the slow suite runs (the default suite runs a sample of the sweep)."""
    return pytest.param(*values, marks=pytest.mark.slow, **kw)


def pytest_configure(config):
    config.addinivalue_line("markers", f"slow: a long sweep, run only when ${SLOW_ENV} is set (.ci/run sets it)")
    config.addinivalue_line("markers", "textworlds: needs Java and the textworlds extra (TextWorldExpress, "
                                       f"ScienceWorld); run only when ${SLOW_ENV} is set (.ci/run sets it)")
    config.addinivalue_line("markers", "browser: the dashboard in a real browser (chromium, the browser extra); "
                                       f"run only when ${SLOW_ENV} is set (.ci/run sets it)")
    config.addinivalue_line("markers", "ray: executor ray on a local Ray cluster (the ray extra); run only when "
                                       f"${SLOW_ENV} is set (.ci/run sets it)")
    config.addinivalue_line("markers", "agentcli: a real agent CLI from npm (.ci/run installs it at a pinned "
                                       f"version); run only when ${SLOW_ENV} is set")
    config.addinivalue_line("markers", "policy: trains a tiny model with TRL (the train extra: torch's CPU build); "
                                       f"run only when ${SLOW_ENV} is set (.ci/run sets it)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get(SLOW_ENV):
        return
    skip = pytest.mark.skip(reason=f"slow suite: set {SLOW_ENV}=1 to run it (.ci/run does)")
    for item in items:
        if any(mark in item.keywords for mark in ("slow", "textworlds", "browser", "ray", "agentcli", "policy")):
            item.add_marker(skip)


def pytest_xdist_auto_num_workers(config):
    """Workers for `-n auto` (pyproject's addopts): two more than the machine has cores, since the tests spend part
    of their time waiting on subprocesses, sockets and timeouts (on 2 cores, 4 workers ran the suite in 5 min 15 s
    where 3 took 5 min 42 s, 2026-11-29); at least 2, at most 8."""
    return max(2, min(8, (os.cpu_count() or 1) + 2))


def pytest_terminal_summary(terminalreporter):
    """One line per reason a test was skipped, with how many (pytest's -ra would print one line per place)."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section("skipped, by reason", sep="-")
        for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            terminalreporter.write_line(f"{n:>5}  {reason}")


class Recorder:
    """Progress callback that keeps every (event, state) pair."""

    def __init__(self):
        self.items = []

    def __call__(self, p):
        if p.kind == "event":
            self.items.append((p.event, p.state, p.stored))


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """One completed small sim run, shared by read-only tests."""
    path = tmp_path_factory.mktemp("finished") / "run.db"
    store = Store(f"sqlite:///{path}")
    rec = Recorder()
    result = Trainer(small_config(), store=store, run_id="base", on_progress=rec).train()
    yield store, result, rec
    store.close()


class RunTemplates:
    """Finished runs built once per test process, each in a SQLite file of its own: a test that reads, forks,
    resumes or damages a finished run starts from a byte copy of that file (the same run ids, events, hashes and
    calls) instead of training it again. Under xdist each worker builds its own (a session fixture is per process),
    in its own temporary folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.built: set[str] = set()

    def copy(self, name: str, build: Callable[[str], None], dest: Path) -> str:
        """The SQLite URL of `dest`, a copy of the template `name`; `build(url)` writes the template into an empty
        database the first time."""
        src = self.folder / f"{name}.db"
        if name not in self.built:
            for path in (src, Path(f"{src}-wal"), Path(f"{src}-shm")):
                path.unlink(missing_ok=True)  # what a build that failed left
            build(f"sqlite:///{src}")
            # the whole log into the file itself (a store the build left open may still hold part of it in the WAL)
            with contextlib.closing(sqlite3.connect(src)) as conn:
                busy, frames, moved = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            assert busy == 0 and frames == moved, f"template {name}: the WAL was not written back ({frames}, {moved})"
            self.built.add(name)
        shutil.copyfile(src, dest)
        return f"sqlite:///{dest}"


def computed_once(tmp_path_factory, name: str, compute: Callable[[], object]):
    """`compute()`'s result (JSON data), computed once per test session, whatever the number of workers: under
    xdist each worker is a process of its own, so a session or module fixture is built once in each; with this
    the first worker to ask computes it and writes it to the session's shared temporary folder, and the others
    wait for it (a file lock) and read it (pytest-xdist's recipe for data shared between workers). `name` names
    what is computed: the same name, the same data."""
    import fcntl
    import json

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder all of the session's workers make theirs in
    path = root / f"shared-{name}.json"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when compute() fails
        if path.exists():
            return json.loads(path.read_text(encoding="utf-8"))
        data = compute()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)
        return json.loads(path.read_text(encoding="utf-8"))  # the same form for every worker


@pytest.fixture(scope="session")
def run_templates(tmp_path_factory) -> RunTemplates:
    return RunTemplates(tmp_path_factory.mktemp("templates"))


@pytest.fixture(scope="session")
def sim_world() -> SimWorld:
    return SimWorld([i for items in bundled_splits().values() for i in items])


@pytest.fixture
def sim_server():
    """The examples/qa world behind an OpenAI-compatible API on 127.0.0.1."""
    from skillstate.envs import load_dataset_dir

    splits = load_dataset_dir(EXAMPLES / "qa", ["train", "val", "test"])
    with SimServer(SimWorld([i for items in splits.values() for i in items])) as server:
        yield server


class Scripted:
    """A backend whose optimizer replies come from a function of the prompt;
    the target is the sim world unless `target` is given."""

    name = "sim"

    def __init__(self, world, optimizer=None, target=None):
        from skillstate.sim.backend import SimBackend

        self.sim = SimBackend(world)
        self.optimizer = optimizer
        self.target = target

    def complete(self, request):
        from skillstate.llm.base import ChatResponse

        messages = request.message_dicts()
        user = messages[-1]["content"]
        if "<skill>" in user and self.optimizer is not None:
            return ChatResponse(text=self.optimizer(user), prompt_tokens=10, completion_tokens=5)
        if "<skill>" not in user and self.target is not None:
            return ChatResponse(text=self.target(messages), prompt_tokens=10, completion_tokens=1)
        return self.sim.complete(request)


def scripted_factory(optimizer=None, target=None):
    from skillstate.sim.world import SimWorld

    def factory(config, env, role):
        return Scripted(SimWorld([i for items in env.splits.values() for i in items]), optimizer, target)

    return factory


class Crash(BaseException):
    """Stands for the process dying (not an LLM error the engine absorbs)."""


def crashing_factory(after_calls: int):
    """A backend factory whose backends die (raise Crash) once `after_calls`
    requests have been sent, counting across roles."""
    from skillstate.engine.runner import make_backend

    count = {"n": 0}

    def factory(config, env, role):
        real = make_backend(config, env, role)

        class Dying:
            name = real.name

            def complete(self, request):
                count["n"] += 1
                if count["n"] > after_calls:
                    raise Crash()
                return real.complete(request)

        return Dying()

    return factory


def logical_usage(summary: dict) -> dict:
    """The calls and tokens the run's events count (what `sent`, `unused` and
    `failed_unrecorded` add depends on timing: an early reject lets the calls
    in flight finish, and work done ahead may or may not be used)."""
    timed = ("unused", "failed_unrecorded")
    return {role: {k: v for k, v in u.items() if not k.startswith("sent") and k not in timed}
            for role, u in summary["usage"].items()}


def assert_paid_once(store, run_id: str) -> None:
    """No request was sent twice: what a crashed session sent is served on resume."""
    hashes = [c.request_hash for c in store.read_calls(run_id) if c.error is None]
    assert len(hashes) == len(set(hashes))


def trajectories_file(path, n: int = 24) -> str:
    """A JSONL file of `n` one-step trajectories in SkillRL's format from the sim world's train items, every
    third a failure (mode bank's `bank.trajectories`)."""
    import json

    rows = []
    for i, item in enumerate(bundled_splits()["train"][:n]):
        ok = i % 3 != 0
        rows.append({"id": f"t{i}", "task_description": item["question"], "task_category": item["task_type"],
                     "steps": [{"observation": item["question"], "action": item["answers"][0] if ok else "?",
                                "reward": float(ok), "step_index": 0}],
                     "total_reward": float(ok), "success": ok, "metadata": {}})
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    return str(path)
