"""Load test: many sim runs driven at once against one PostgreSQL database,
with a poller reading it the whole time, as a team's shared store would see.

    python bench/load_pg.py [--db URL] [--runs 8] [--epochs 4] [--json]

URL defaults to $SKILLSTATE_TEST_PG_URL. The test works in a fresh schema of
that database (dropped at the end unless --keep), so its figures are its own.

1. A reference run of the same config on a temporary SQLite file gives the
   log every run must end up with.
2. `skillstate dashboard --port 0` is started on the database (when the
   dashboard extra is installed), and a poller process that, until the end,
   lists the runs through the library (what `skillstate runs --json` does:
   every run folded) and asks the dashboard for /api/version, /runs/ID and
   /api/runs/ID of a run in progress, timing each request; it also samples
   the server's connection count.
3. N driver processes (`skillstate run`, each presenting itself as another
   machine through $SKILLSTATE_HOST_ID, with `llm_cache: lineage` so that
   every run sends and journals all its own calls) are released at the same
   instant on N run ids.
4. Then, for every run: its sequence numbers are 1..N with no gap and no
   duplicate (count, distinct count, min and max in SQL), its log is the
   reference's event for event (nothing lost, duplicated or altered), no
   request was paid for twice, and `audit` passes.

It prints the throughput (events/s over the wall time, and per run), the
poller's requests/s and latencies, and exits 1 if anything did not verify.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
PG_ENV = "SKILLSTATE_TEST_PG_URL"


# --- the driver and poller processes (this script run with --drive / --poll) ---------------------------------


def drive_main(start_at: float, cli_args: list[str]) -> None:
    """`skillstate CLI_ARGS` released at `start_at` (after the imports)."""
    from skillstate.cli.main import main

    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    sys.argv = ["skillstate", *cli_args]
    main()


def _postgres_cpu() -> float:
    """CPU seconds the PostgreSQL server on this machine used so far: its live processes, and through the
    postmaster's count of its reaped children, the backends that have exited (0 if none is visible)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if comm.startswith("postgres"):
            total += sum(int(v) for v in rest[11:15])  # utime, stime, cutime, cstime
    return total / tick


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user and system, all threads) a live process used so far; 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def _get(url: str) -> None:
    with urllib.request.urlopen(url, timeout=60) as resp:
        resp.read()


def poll_main(url: str, dashboard: str | None, run_ids: list[str], stop_file: str, out_file: str,
              interval: float, start_at: float) -> None:
    """From `start_at`, read the database until `stop_file` appears; write what it timed to `out_file`."""
    from sqlalchemy import text

    from skillstate.cli.runs_view import run_rows
    from skillstate.dashboard.store_view import open_read_only

    store = open_read_only(url)
    postgres = store.engine.dialect.name == "postgresql"
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    timings: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    connections: list[int] = []
    started = time.perf_counter()
    rounds = 0

    def timed(kind: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - counted and reported
            errors[kind] = errors.get(kind, 0) + 1
            errors[f"{kind}: {type(err).__name__}: {str(err)[:120]}"] = 1
            return
        timings.setdefault(kind, []).append(time.perf_counter() - t0)

    last_sample = 0.0
    while not os.path.exists(stop_file):
        rounds += 1
        rows = store.list_runs()
        present = [r.run_id for r in rows if r.run_id in run_ids]
        if present:  # (before the drivers created their runs there is nothing to fold)
            timed("runs listing (library)", lambda rows=rows: run_rows(store, rows))
        if dashboard:
            timed("dashboard /api/version", lambda: _get(f"{dashboard}/api/version"))
        if dashboard and present:
            rid = present[rounds % len(present)]
            timed("dashboard /runs/ID", lambda rid=rid: _get(f"{dashboard}/runs/{rid}"))
            timed("dashboard /api/runs/ID", lambda rid=rid: _get(f"{dashboard}/api/runs/{rid}"))
        if postgres and time.perf_counter() - last_sample > 0.5:
            last_sample = time.perf_counter()
            with store.engine.connect() as conn:
                connections.append(int(conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")).scalar() or 0))
        time.sleep(interval)
    elapsed = time.perf_counter() - started
    store.close()
    Path(out_file).write_text(json.dumps({"seconds": elapsed, "timings": timings, "errors": errors,
                                          "connections": connections}))


# --- the load test -----------------------------------------------------------------------------------------


def fresh_schema(base: str) -> tuple[str, str]:
    from sqlalchemy import create_engine, text

    schema = f"load_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    sep = "&" if "?" in base else "?"
    return schema, f"{base}{sep}options=-csearch_path%3D{schema}"


def drop_schema(base: str, schema: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    admin.dispose()


def reference_log(run_args: list[str], workdir: Path) -> tuple[list[tuple[str, str]], float]:
    """The (type, payload) list of the config run alone on SQLite, and how long it took."""
    from skillstate.storage.store import Store

    url = f"sqlite:///{workdir / 'reference.db'}"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "skillstate.cli.main", "run", "--run-id", "ref", *run_args,
                          "--db", url], cwd=str(workdir), capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"the reference run failed: {res.stderr.strip()[-500:]}")
    store = Store(url)
    try:
        return [(s.type, s.payload) for s in store.read_events("ref")], took
    finally:
        store.close()


def start_dashboard(url: str, workdir: Path) -> tuple[subprocess.Popen | None, str | None]:
    try:
        import skillstate.dashboard.app  # noqa: F401
    except ImportError:
        return None, None
    proc = subprocess.Popen([sys.executable, "-m", "skillstate.cli.main", "dashboard", "--db", url, "--port", "0"],
                            cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if not match:
        proc.kill()
        proc.wait()
        raise SystemExit(f"the dashboard did not start: {line!r}")
    return proc, match.group(1)


def quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def verify_runs(url: str, run_ids: list[str], reference: list[tuple[str, str]]) -> list[dict[str, Any]]:
    from collections import Counter

    from sqlalchemy import distinct, func, select

    from skillstate.reading.audit import audit
    from skillstate.storage.schema import events
    from skillstate.storage.store import Store

    store = Store(url, upgrade=False)
    out = []
    try:
        for rid in run_ids:
            with store.engine.connect() as conn:
                n, distinct_n, lo, hi = conn.execute(
                    select(func.count(), func.count(distinct(events.c.seq)), func.min(events.c.seq),
                           func.max(events.c.seq)).where(events.c.run_id == rid)).one()
            log = [(s.type, s.payload) for s in store.read_events(rid)]
            paid = Counter(c.request_hash for c in store.read_calls(rid) if c.error is None)
            report = audit(store, rid)
            out.append({
                "run_id": rid, "events": int(n), "contiguous": n == distinct_n == (hi or 0) and (lo or 1) == 1,
                "equals_reference": log == reference, "paid_twice": sum(1 for v in paid.values() if v > 1),
                "calls_sent": sum(paid.values()), "audit_ok": report.ok,
                "audit_problem": report.problems[0] if report.problems else None,
            })
    finally:
        store.close()
    return out


def server_commits(url: str) -> int:
    """Transactions the PostgreSQL server committed in the database so far (reads count too); 0 on SQLite."""
    from sqlalchemy import text

    from skillstate.storage.store import Store

    store = Store(url, upgrade=False)
    if store.engine.dialect.name != "postgresql":
        store.close()
        return 0
    try:
        with store.engine.connect() as conn:
            return int(conn.execute(text("SELECT xact_commit FROM pg_stat_database "
                                         "WHERE datname = current_database()")).scalar() or 0)
    finally:
        store.close()


def load_test(base: str, *, runs: int = 8, epochs: int = 4, batch_size: int | None = None, cache: str = "lineage",
              dashboard: bool = True, interval: float = 0.1, keep: bool = False, fresh: bool = True,
              progress=print) -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    from skillstate.storage.store import Store

    load_before = os.getloadavg()
    run_args = ["--epochs", str(epochs), "-q", "--set", f"llm_cache={cache}"]
    if batch_size:
        run_args += ["--batch-size", str(batch_size)]
    sqlite = make_url(base).get_backend_name() == "sqlite"
    schema, url = fresh_schema(base) if fresh and not sqlite else (None, base)
    work = Path(tempfile.mkdtemp(prefix="load_pg_"))
    dash = poller = None
    try:
        progress(f"reference run on SQLite ({' '.join(run_args)}) ...")
        reference, ref_seconds = reference_log(run_args, work)
        Store(url).close()  # the schema, before the drivers start
        dash, dash_url = start_dashboard(url, work) if dashboard else (None, None)
        run_ids = [f"load-{i + 1}" for i in range(runs)]
        stop_file, poll_out = work / "stop", work / "poll.json"
        start_at = time.time() + 3.0 + 0.25 * runs  # after every driver has imported everything
        poller = subprocess.Popen([sys.executable, str(HERE), "--poll", "--db", url, "--dashboard-url",
                                   dash_url or "", "--run-ids", ",".join(run_ids), "--stop-file", str(stop_file),
                                   "--out", str(poll_out), "--interval", str(interval), "--start-at", str(start_at)],
                                  cwd=str(work))
        commits_before = server_commits(url)
        drivers = []
        for i, rid in enumerate(run_ids):
            env = {**os.environ, "SKILLSTATE_HOST_ID": f"load-machine-{i + 1}"}
            with open(work / f"{rid}.err", "w") as err:
                drivers.append(subprocess.Popen(
                    [sys.executable, str(HERE), "--drive", str(start_at), "--", "run", "--run-id", rid, *run_args,
                     "--db", url], cwd=str(work), env=env, stdout=subprocess.DEVNULL, stderr=err))
        progress(f"{runs} drivers on {make_url(url).render_as_string(hide_password=True)} ...")
        ended: dict[str, float] = {}
        codes: dict[str, int] = {}
        cpu: dict[str, float] = {}

        def wait(rid: str, proc: subprocess.Popen) -> None:
            _, status, usage = os.wait4(proc.pid, 0)  # (its CPU time too)
            ended[rid] = time.time()
            codes[rid] = proc.returncode = os.waitstatus_to_exitcode(status)
            cpu[rid] = usage.ru_utime + usage.ru_stime

        waiters = [threading.Thread(target=wait, args=(rid, p)) for rid, p in zip(run_ids, drivers, strict=True)]
        for th in waiters:
            th.start()
        time.sleep(max(0.0, start_at - time.time()))
        readers = {"poller": poller.pid, **({"dashboard": dash.pid} if dash is not None else {})}
        readers_cpu = {name: -_proc_cpu(pid) for name, pid in readers.items()}
        server_cpu = -_postgres_cpu()
        for th in waiters:
            th.join()
        for name, pid in readers.items():
            readers_cpu[name] += _proc_cpu(pid)
        time.sleep(0.5)  # the drivers' server processes exit and are counted
        server_cpu += _postgres_cpu()
        wall = max(ended.values()) - start_at
        commits = server_commits(url) - commits_before
        stop_file.write_text("stop")
        poller.wait(timeout=120)
        polled = json.loads(poll_out.read_text()) if poll_out.exists() else {"timings": {}, "errors": {"poller": 1}}
        failed = {rid: (work / f"{rid}.err").read_text().strip()[-300:] for rid, rc in codes.items() if rc != 0}
        checks = verify_runs(url, run_ids, reference)
        for c in checks:
            c["seconds"] = ended[c["run_id"]] - start_at
            c["events_per_second"] = c["events"] / c["seconds"] if c["seconds"] > 0 else None
            c["exit_code"] = codes[c["run_id"]]
            c["cpu_seconds"] = cpu[c["run_id"]]
        total = sum(c["events"] for c in checks)
        calls = sum(c["calls_sent"] for c in checks)
        poll_seconds = polled.get("seconds") or wall
        requests = {kind: {"n": len(v), "per_second": len(v) / poll_seconds, "p50_ms": 1000 * quantile(v, 0.5),
                           "p95_ms": 1000 * quantile(v, 0.95), "max_ms": 1000 * max(v)}
                    for kind, v in polled["timings"].items() if v}
        ok = (not failed and not polled["errors"]
              and all(c["contiguous"] and c["equals_reference"] and c["audit_ok"] and not c["paid_twice"]
                      for c in checks))
        return {
            "ok": ok, "runs": runs, "epochs": epochs, "llm_cache": cache, "reference_events": len(reference),
            "reference_seconds_alone_on_sqlite": ref_seconds, "wall_seconds": wall, "events": total,
            "events_per_second": total / wall, "calls_sent": calls, "calls_per_second": calls / wall,
            "server_commits": commits, "commits_per_second": commits / wall,
            "max_connections_seen": max(polled.get("connections") or [0]), "per_run": checks,
            "poller": requests, "poller_errors": polled["errors"], "driver_failures": failed,
            "cpus": os.cpu_count(), "backend": make_url(url).get_backend_name(),
            "driver_cpu_seconds": sum(cpu.values()), "load_average_after": os.getloadavg(),
            "load_average_before": load_before, "server_cpu_seconds": server_cpu if not sqlite else None,
            "reader_cpu_seconds": readers_cpu,
        }
    finally:
        for proc in (poller, dash):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if schema is not None and not keep:
            drop_schema(base, schema)
        elif schema is not None:
            progress(f"kept schema {schema}")


def print_report(r: dict[str, Any]) -> None:
    print(f"{r['backend']}: {r['runs']} runs x {r['reference_events']} events ({r['epochs']} epochs, "
          f"llm_cache {r['llm_cache']}), "
          f"{r['cpus']} cpus; one run alone on SQLite took {r['reference_seconds_alone_on_sqlite']:.1f} s")
    print(f"wall {r['wall_seconds']:.1f} s: {r['events']} events, {r['events_per_second']:.1f} events/s; "
          f"{r['calls_sent']} LLM calls journaled, {r['calls_per_second']:.0f}/s; "
          f"{r['server_commits']} server transactions, {r['commits_per_second']:.0f}/s; "
          f"at most {r['max_connections_seen']} connections")
    server = (f", the PostgreSQL server {r['server_cpu_seconds']:.0f}" if r.get("server_cpu_seconds") else "")
    readers = "".join(f", the {name} {v:.0f}" for name, v in r["reader_cpu_seconds"].items())
    print(f"CPU seconds: the drivers used {r['driver_cpu_seconds']:.0f}{server}{readers}, of the "
          f"{r['wall_seconds'] * r['cpus']:.0f} the machine had; load average before "
          f"{r['load_average_before'][0]:.1f}, after {r['load_average_after'][0]:.1f}")
    print()
    print(f"{'run':<10} {'events':>6} {'seconds':>7} {'events/s':>8} {'CPU s':>5} {'seq 1..N':>8} {'= ref':>5} "
          f"{'paid 2x':>7} {'audit':>5}")
    for c in r["per_run"]:
        print(f"{c['run_id']:<10} {c['events']:>6} {c['seconds']:>7.1f} {c['events_per_second']:>8.1f} "
              f"{c['cpu_seconds']:>5.1f} "
              f"{'yes' if c['contiguous'] else 'NO':>8} {'yes' if c['equals_reference'] else 'NO':>5} "
              f"{c['paid_twice']:>7} {'ok' if c['audit_ok'] else 'FAIL':>5}")
    print()
    print(f"{'poller request':<26} {'n':>5} {'per s':>6} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7}")
    for kind, s in r["poller"].items():
        print(f"{kind:<26} {s['n']:>5} {s['per_second']:>6.1f} {s['p50_ms']:>7.1f} {s['p95_ms']:>7.1f} "
              f"{s['max_ms']:>7.1f}")
    if r["poller_errors"] or r["driver_failures"]:
        print(f"\nerrors: {r['poller_errors']} {r['driver_failures']}")
    print("\nverified: nothing lost or duplicated, every run audits" if r["ok"] else "\nNOT VERIFIED")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--drive"]:
        drive_main(float(argv[1]), argv[3:] if argv[2:3] == ["--"] else argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get(PG_ENV),
                        help=f"PostgreSQL URL (default ${PG_ENV}); a sqlite:/// URL runs the same test on one file")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4, help="num_epochs of every run (3 steps each)")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--cache", choices=["lineage", "all"], default="lineage",
                        help="llm_cache of the runs (lineage: every run journals all its own calls)")
    parser.add_argument("--no-dashboard", action="store_true")
    parser.add_argument("--interval", type=float, default=0.1, help="the poller's pause between rounds (s)")
    parser.add_argument("--keep", action="store_true", help="keep the schema the test wrote")
    parser.add_argument("--no-fresh-schema", action="store_true", help="use --db as it is (its search path)")
    parser.add_argument("--json", action="store_true")
    # the poller process
    parser.add_argument("--poll", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dashboard-url", help=argparse.SUPPRESS)
    parser.add_argument("--run-ids", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.db:
        parser.error(f"no database: pass --db or set ${PG_ENV}")
    if args.poll:
        poll_main(args.db, args.dashboard_url or None, args.run_ids.split(","), args.stop_file, args.out,
                  args.interval, args.start_at)
        return 0
    quiet = (lambda *_: None) if args.json else (lambda msg: print(msg, file=sys.stderr))
    result = load_test(args.db, runs=args.runs, epochs=args.epochs, batch_size=args.batch_size, cache=args.cache,
                       dashboard=not args.no_dashboard, interval=args.interval, keep=args.keep,
                       fresh=not args.no_fresh_schema, progress=quiet)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_report(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
