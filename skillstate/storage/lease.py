"""One driver per run: a lease row per run in the database.

A process that drives a run (run, resume, fork, eval) takes the run's lease
before it sends anything and renews it while it works, so a second driver is
refused up front instead of at its first append, after paying for a stage.
The lease lapses when its holder stops renewing it: `ttl` seconds after a
holder on another machine died, and at once when the holder was a process on
this machine that no longer exists, so a crashed run resumes right away.
Leases coordinate writers; they are not run state and never enter the log.

A holder is named `HOST:PID:TOKEN`. HOST is the machine's hostname, or
$SKILLSTATE_HOST_ID when set: the name a driver gives its machine, for
containers or pods whose hostnames collide (or that share one across pid
namespaces). Processes that give the same HOST must see each other's pids,
since a holder on "this machine" whose pid is gone is taken over at once.
$SKILLSTATE_LEASE_TTL sets the ttl in seconds (default 60): a holder renews
every ttl/4.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import socket
import threading

from sqlalchemy import and_, delete, or_, select, update

from skillstate.errors import RunBusyError, UserError
from skillstate.storage.store import Store, insert_ignoring_duplicates, run_leases

DEFAULT_TTL = 60.0
HOST_ID_ENV = "SKILLSTATE_HOST_ID"
TTL_ENV = "SKILLSTATE_LEASE_TTL"


def host_id() -> str:
    """The name of this machine in lease holders: $SKILLSTATE_HOST_ID, else the hostname."""
    name = os.environ.get(HOST_ID_ENV)
    if name is None or name == "":
        return socket.gethostname()
    if ":" in name or len(name) > 200 or not name.isprintable() or name != name.strip():
        raise UserError(f"${HOST_ID_ENV} must be a name of at most 200 printable characters without ':' or "
                        f"surrounding spaces, got {name!r}")
    return name


def lease_ttl() -> float:
    """The lease ttl in seconds: $SKILLSTATE_LEASE_TTL, else 60."""
    text = os.environ.get(TTL_ENV)
    if not text:
        return DEFAULT_TTL
    try:
        ttl = float(text)
    except ValueError:
        ttl = float("nan")
    if not 0.5 <= ttl <= 86400:  # (nan fails too)
        raise UserError(f"${TTL_ENV} must be a number of seconds from 0.5 to 86400, got {text!r}")
    return ttl


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def _holder_gone(holder: str) -> bool:
    """True when `holder` names a process on this machine that has exited."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != host_id() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class RunLease:
    """The lease of one run, held by this process while it drives the run."""

    def __init__(self, store: Store, run_id: str, ttl: float | None = None):
        self.store, self.run_id, self.ttl = store, run_id, lease_ttl() if ttl is None else ttl
        self.holder = f"{host_id()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> RunLease:
        now = _now()
        expires = now + dt.timedelta(seconds=self.ttl)
        with self.store.engine.begin() as conn:
            row = conn.execute(select(run_leases.c.holder, run_leases.c.expires_at)
                               .where(run_leases.c.run_id == self.run_id)).first()
            if row is None:
                taken = conn.execute(insert_ignoring_duplicates(conn, run_leases).values(
                    run_id=self.run_id, holder=self.holder, expires_at=expires)
                    .returning(run_leases.c.run_id)).first() is not None
            else:
                free = [run_leases.c.expires_at < now]
                if _holder_gone(row.holder):
                    free.append(run_leases.c.holder == row.holder)
                taken = conn.execute(update(run_leases).where(and_(run_leases.c.run_id == self.run_id, or_(*free)))
                                     .values(holder=self.holder, expires_at=expires)).rowcount == 1
        if not taken:
            self._refuse()
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def _refuse(self) -> None:
        with self.store.engine.connect() as conn:
            row = conn.execute(select(run_leases.c.holder, run_leases.c.expires_at)
                               .where(run_leases.c.run_id == self.run_id)).first()
        who, until = (row.holder.rsplit(":", 1)[0], _aware(row.expires_at)) if row else ("another process", _now())
        raise RunBusyError(f"run {self.run_id!r} is being driven by another process ({who}); wait for it to "
                           f"finish, or, if it died on another machine, retry after "
                           f"{until.strftime('%H:%M:%S')} UTC when its lease lapses")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                with self.store.engine.begin() as conn:
                    kept = conn.execute(
                        update(run_leases)
                        .where(and_(run_leases.c.run_id == self.run_id, run_leases.c.holder == self.holder))
                        .values(expires_at=_now() + dt.timedelta(seconds=self.ttl))).rowcount == 1
            except Exception:  # a database hiccup: try again at the next tick
                continue
            if not kept:
                self.lost = True
                return

    def check(self) -> None:
        if self.lost:
            raise RunBusyError(f"run {self.run_id!r}: this process lost its lease (it did not renew it in time "
                               "and another driver took over); nothing more is appended")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            with self.store.engine.begin() as conn:
                conn.execute(delete(run_leases).where(and_(run_leases.c.run_id == self.run_id,
                                                           run_leases.c.holder == self.holder)))
        except Exception:  # the lease lapses by itself
            pass

    def __enter__(self) -> RunLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
