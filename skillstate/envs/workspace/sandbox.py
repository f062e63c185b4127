"""Running a command in a task's workspace, sandboxed with bubblewrap.

A workspace task's agent runs shell commands, and its check runs the project's tests, so both run in a
sandbox: Debian's `bubblewrap` (`bwrap`, 0.8.0 or newer). The command
- runs as an unprivileged user in a user namespace of its own (uid 1000 inside), with no capabilities
  and no way to make another user namespace: for an ordinary driver that user is the driver's own; a
  driver running as root first drops to `sandbox.run_as` (65534 by default) on the host, so nothing the
  command does is done as root (the kernel's settings under /proc/sys, /etc/shadow and every root-only
  file are out of its reach);
- sees an allow-list of the machine (`sandbox_view`): the system folders read-only, the Python that runs
  skillstate, a private /tmp and /dev/shm of `tmp_mb` each, and the workspace, the one writable folder
  of the host;
- has no network (its own empty network namespace), and its own process namespace (nothing it starts
  outlives it);
- runs within these limits: `wall_seconds`; `memory_mb`, the memory it may use, its in-memory folders
  included, in a memory cgroup of its own where the driver can make one (root), and its address space
  (`RLIMIT_AS`) in any case; `max_processes` tasks, in a pids cgroup where one can be made, else by
  `RLIMIT_NPROC` beyond what its user runs already; no file larger than 64 MB.

What went wrong is reported in the result, never raised: a command that cannot start, times out, runs out
of memory or is stopped is an outcome the agent (or the check) reads. `sandbox: none` runs the command
without bubblewrap, with the same limits but no isolation: only on a user's explicit choice.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skillstate.envs.workspace.cgroups import Group, make_group
from skillstate.envs.workspace.sandbox_view import INSIDE_UID, view_args
from skillstate.envs.workspace.workspace_scan import scan
from skillstate.errors import ConfigError

MAX_OUTPUT = 20_000  # characters of a command's output kept
KILL_GRACE = 15.0  # seconds a killed sandbox gets to close its output
MAX_FILE_BYTES = 64 * 1024 * 1024  # the largest file a command may write (RLIMIT_FSIZE), its output included
MIN_BWRAP = (0, 8, 0)  # --size (bounded in-memory folders) and --disable-userns
NOBODY = 65534


class SandboxSettings(BaseModel):
    """`env_config.sandbox` of a workspace environment."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["bwrap", "none"] = Field(
        "bwrap", description="bwrap: commands run under bubblewrap (Debian's bubblewrap package); none: without "
                             "isolation, only when you choose it (the run's log records the choice)")
    wall_seconds: float = Field(60.0, gt=0, le=3600, description="Kill a command that runs longer (seconds).")
    memory_mb: int = Field(2048, ge=64, le=1_048_576,
                           description="Memory a command may use (MB): in a memory cgroup, its in-memory folders "
                                       "counted, where the driver can make one (root); its address space always.")
    max_processes: int = Field(256, ge=8, le=65_536, description="Processes the sandbox's user may have at once.")
    tmp_mb: int = Field(512, ge=16, le=1_048_576, description="Size of the command's private /tmp and /dev/shm "
                                                              "(MB each; in memory).")
    workspace_mb: int = Field(1024, ge=16, le=1_048_576,
                              description="The most the workspace may hold (MB); past it the rollout ends.")
    workspace_files: int = Field(100_000, ge=100, le=10_000_000,
                                 description="The most files and folders the workspace may hold; past it the "
                                             "rollout ends.")
    run_as: int = Field(NOBODY, ge=1, le=2**31 - 2,
                        description="A driver running as root runs the commands as this host uid (and gid): an "
                                    "unprivileged user (default nobody), never root.")
    show: list[str] = Field(default_factory=list,
                            description="More of the machine every command may read (absolute paths, read-only): a "
                                        "toolchain under /opt, say. The paths the run names stay hidden.")

    @field_validator("show")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not os.path.isabs(path):
                raise ValueError(f"show: {path!r} is not an absolute path")
        return value


@dataclass(frozen=True)
class CommandResult:
    """What a command did: its exit code (None when it never finished), its output (stdout and stderr, in
    order, clipped), whether it ran out of time, and which other limit ended it (`memory`, `workspace`)."""

    exit_code: int | None
    output: str
    timed_out: bool = False
    limit: str | None = None
    limit_mb: int = 0
    passed: str = ""  # which bound of the workspace it passed

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        if self.timed_out:
            return "killed: it ran past the time limit"
        if self.limit == "memory":
            return f"killed: it used more than its {self.limit_mb} MB of memory"
        if self.limit == "workspace":
            return f"killed: {self.passed}"
        if self.exit_code is None:
            return "it could not start"
        if self.exit_code < 0:
            return f"killed by signal {-self.exit_code}"
        return f"exit code {self.exit_code}"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@cache
def bwrap_version(path: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    digits = out.strip().split()[-1] if out.strip() else ""
    try:
        return tuple(int(p) for p in digits.split("."))
    except ValueError:
        return ()


def check_sandbox(settings: SandboxSettings) -> None:
    """A one-line ConfigError when the sandbox the settings ask for cannot start here."""
    if settings.kind == "none":
        return
    path = bwrap_path()
    if path is None:
        raise ConfigError("the workspace sandbox needs bubblewrap (apt install bubblewrap); to run commands "
                          "without isolation, set env_config.sandbox.kind: none")
    version = bwrap_version(path)
    if version < MIN_BWRAP:
        shown = ".".join(map(str, version)) or "of unknown version"
        raise ConfigError(f"bubblewrap {shown} is too old: the sandbox needs 0.8.0 or newer (bounded in-memory "
                          "folders, no nested user namespaces); to run commands without isolation, set "
                          "env_config.sandbox.kind: none")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        raise ConfigError("a root driver's sandbox drops to an unprivileged user with setpriv (util-linux), "
                          "which is not installed; to run commands without isolation, set "
                          "env_config.sandbox.kind: none")
    with tempfile.TemporaryDirectory(prefix="skillstate-probe-") as tmp:
        result = run_command("true", Path(tmp), settings)
    if not result.ok:
        last = result.output.strip().splitlines()[-1] if result.output.strip() else "no output"
        who = (f" as uid {settings.run_as} (sandbox.run_as) in a user namespace of its own"
               if os.geteuid() == 0 else " in a user namespace of its own")
        raise ConfigError(f"bubblewrap cannot start a sandbox{who} here ({result.summary()}: {last}); "
                          "unprivileged user namespaces must be allowed (sysctl kernel.unprivileged_userns_clone, "
                          "user.max_user_namespaces); to run commands without isolation, set "
                          "env_config.sandbox.kind: none")


def processes_of(uid: int) -> int:
    """How many tasks (processes and their threads) the user `uid` has now: RLIMIT_NPROC counts them all, the
    driver's threads included."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    count += len(os.listdir(os.path.join(entry.path, "task")))
            except OSError:
                continue
    return count


def hand_over(root: Path, uid: int, max_entries: int = 1_000_000) -> None:
    """Make `root` and everything in it (no symlink followed) owned by `uid`, for a root driver whose sandbox runs
    as that user: what the driver wrote there since (a file the agent's tool wrote, the check's files) too."""
    top = os.fsencode(root)
    for entry in scan(root, max_entries).entries:
        if entry.st.st_uid != uid:
            try:
                os.lchown(os.path.join(top, entry.rel), uid, uid)
            except OSError:
                continue
    try:
        os.lchown(root, uid, uid)
    except OSError:
        pass


def sandbox_user() -> int:
    """The host uid a sandboxed command runs as when the driver is not root: the driver's own."""
    return os.geteuid()


def _limits(address_bytes: int, nproc: int | None, group: Group | None):
    def apply() -> None:
        os.setsid()
        if group is not None:
            group.join(os.getpid())
        resource.setrlimit(resource.RLIMIT_AS, (address_bytes, address_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _tool(name: str) -> str:
    found = shutil.which(name)
    return os.path.realpath(found) if found else name


def bwrap_argv(workspace: Path, inside: str | None = None, binds: dict[str, str] | None = None,
               shown: list[str] | None = None, home: str | None = None, run_as: int = NOBODY,
               tmp_mb: int = 512, readonly: dict[str, str] | None = None) -> list[str]:
    """bubblewrap's arguments: the view (`sandbox_view`: the workspace writable at `inside`, the same path in
    every rollout; `shown` read-only; each of `binds`, host path -> path inside, writable, and of `readonly`
    read-only), its namespaces, and,
    for a root driver, the drop to `run_as` before the command's own user namespace is made; HOME is the
    workspace unless `home`."""
    ws = str(workspace.resolve())
    at = inside or ws
    bwrap, setpriv = _tool("bwrap"), _tool("setpriv")
    tools = [bwrap, setpriv] if os.geteuid() == 0 else []
    view = view_args(ws, at, shown=[*(shown or []), *tools], binds=binds, readonly=readonly, tmp_mb=tmp_mb)
    env = ["--setenv", "HOME", home or at, "--setenv", "TMPDIR", "/tmp", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
           "--setenv", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1"]
    own = ["--unshare-user", "--disable-userns", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID),
           "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--chdir", at, *env, "--"]
    if os.geteuid() != 0:
        return [bwrap, "--unshare-all", *view, *own]
    # root: the view and the namespaces are made as root (root reads what the view needs), then setpriv drops
    # to `run_as` for good, and an unprivileged bubblewrap makes the command's own user namespace around it
    return [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", *view, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
            "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP", "--chdir", "/", "--",
            setpriv, f"--reuid={run_as}", f"--regid={run_as}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--",
            bwrap, "--dev-bind", "/", "/", *own]


def run_command(command: str, workspace: Path, settings: SandboxSettings, inside: str | None = None,
                **kwargs) -> CommandResult:
    """Run `command` (a shell command line) in `workspace` under the sandbox the settings name. `python` on its
    PATH is the Python that runs skillstate."""
    return run_sandboxed(["/bin/sh", "-c", command], workspace, settings, inside, **kwargs)


def run_sandboxed(argv: list[str], workspace: Path, settings: SandboxSettings, inside: str | None = None, *,
                  env: dict[str, str] | None = None, binds: dict[str, str] | None = None,
                  shown: list[str] | None = None, stdin: str | None = None, wall_seconds: float | None = None,
                  max_output: int = MAX_OUTPUT, stop: threading.Event | None = None,
                  address_mb: int | None = None, watch: Callable[[], str | None] | None = None,
                  readonly: dict[str, str] | None = None) -> CommandResult:
    """Run `argv` in `workspace` under the sandbox the settings name, with `env` added to its environment and
    `stdin` as its input; `wall_seconds` and `max_output` replace the settings' time limit and the output kept,
    `address_mb` the address space (else `memory_mb`); once `stop` is set the command is killed (its result says
    it was stopped); `watch`, asked twice a second, says which bound the workspace has passed (the command is
    then killed); `readonly` (host path -> path inside) is bound in read-only."""
    sandboxed = settings.kind == "bwrap"
    dropped = sandboxed and os.geteuid() == 0  # a root driver's sandbox runs as `run_as`
    if dropped:  # the command's user must be able to write what it is given
        hand_over(workspace, settings.run_as, settings.workspace_files)
        for host in (binds or {}):
            if os.path.isdir(host):
                hand_over(Path(host), settings.run_as, settings.workspace_files)
            else:
                try:
                    os.chmod(host, 0o666)  # the proxy's socket: a connect needs write permission
                except OSError:
                    pass
    home = (env or {}).get("HOME")
    shown = [*settings.show, *(shown or [])]
    full = ([*bwrap_argv(workspace, inside, binds, shown, home, settings.run_as, settings.tmp_mb, readonly), *argv]
            if sandboxed else argv)
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
    base = {"PATH": path, "LANG": "C.UTF-8", "HOME": str(workspace), "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # pytest itself, not every plugin installed beside skillstate
    user = settings.run_as if dropped else sandbox_user()
    group = make_group(settings.max_processes, settings.memory_mb * 1024 * 1024)
    nproc = None if group is not None else processes_of(user) + settings.max_processes
    address = (address_mb or settings.memory_mb) * 1024 * 1024
    limits = _limits(address, nproc, group)
    try:
        return _run(full, workspace, {**base, **(env or {})}, limits, wall_seconds or settings.wall_seconds,
                    group, user, settings, stdin, max_output, stop, watch)
    finally:
        if group is not None:
            group.drop()


def _run(argv: list[str], workspace: Path, env: dict[str, str], limits: Callable[[], None], seconds: float,
         group: Group | None, user: int, settings: SandboxSettings, stdin: str | None, max_output: int,
         stop: threading.Event | None, watch: Callable[[], str | None] | None) -> CommandResult:
    before = processes_of(user) if group is None else 0
    with tempfile.TemporaryFile() as sink, tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as options:
        source.write((stdin or "").encode())
        source.seek(0)
        argv = _options_from(argv, options)
        try:  # the output goes to a file (RLIMIT_FSIZE bounds it), read head and tail
            proc = subprocess.Popen(argv, cwd=workspace, env=env,
                                    stdin=source if stdin is not None else subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, preexec_fn=limits, pass_fds=(options.fileno(),))
        except (OSError, ValueError, subprocess.SubprocessError) as err:  # a NUL in the command, say
            return CommandResult(None, f"cannot start: {getattr(err, 'strerror', None) or err}")
        try:
            passed = _wait(proc, seconds, stop, watch)
        except subprocess.TimeoutExpired:
            _kill(proc, group)
            _reap(proc, group, before, settings)
            return CommandResult(None, _read_clipped(sink, max_output), timed_out=True)
        if passed is not None:
            _reap(proc, group, before, settings)
            return CommandResult(None, _read_clipped(sink, max_output), limit="workspace", passed=passed)
        if group is not None and group.oom_killed():
            return CommandResult(None, _read_clipped(sink, max_output), limit="memory",
                                 limit_mb=settings.memory_mb)
        if stop is not None and stop.is_set() and proc.returncode is not None and proc.returncode < 0:
            return CommandResult(None, _read_clipped(sink, max_output) + "\n[stopped: the run stopped taking calls]")
        return CommandResult(proc.returncode, _read_clipped(sink, max_output))


def _options_from(argv: list[str], options) -> list[str]:
    """bubblewrap's own options given through a file (`--args FD`), not its command line: the sandbox's first
    process is bubblewrap, and its command line, which the command can read in /proc, would name host paths."""
    if not argv or os.path.basename(argv[0]) != "bwrap" or "--" not in argv:
        return argv
    cut = argv.index("--")
    options.write(b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in argv[1:cut]))
    options.seek(0)
    return [argv[0], "--args", str(options.fileno()), *argv[cut:]]


def _wait(proc: subprocess.Popen, seconds: float, stop: threading.Event | None,
          watch: Callable[[], str | None] | None) -> str | None:
    """Wait for `proc` for up to `seconds` (TimeoutExpired after); kill it as soon as `stop` is set, or `watch`
    names a limit passed (returned)."""
    if stop is None and watch is None:
        proc.wait(timeout=seconds)
        return None
    deadline = time.monotonic() + seconds
    looked = time.monotonic()
    while proc.poll() is None:
        if stop is not None and stop.is_set():
            _kill(proc, None)
            proc.wait(timeout=KILL_GRACE)
            return None
        if watch is not None and time.monotonic() - looked >= 0.5:
            looked = time.monotonic()
            passed = watch()
            if passed is not None:
                _kill(proc, None)
                return passed
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, seconds)
        if stop is not None:
            stop.wait(0.05)
        else:
            time.sleep(0.05)
    return None


def _reap(proc: subprocess.Popen, group: Group | None, before: int, settings: SandboxSettings) -> None:
    """After a kill: wait for the sandbox to close, and for its processes to be gone (they no longer count against
    the next command)."""
    try:  # the sandbox's namespace goes with it; a fork storm can take a few seconds to wind down
        proc.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        pass
    if group is not None:
        group.drop()
        return
    deadline = time.monotonic() + KILL_GRACE
    uid = settings.run_as if os.geteuid() == 0 and settings.kind == "bwrap" else sandbox_user()
    while processes_of(uid) > before + settings.max_processes // 4 and time.monotonic() < deadline:
        time.sleep(0.05)


def _kill(proc: subprocess.Popen, group: Group | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its session: bwrap and everything under it
    except (ProcessLookupError, PermissionError):
        proc.kill()
    if group is not None:
        group.kill()


def _read_clipped(sink, limit: int = MAX_OUTPUT) -> str:
    """The head and the tail of what the command wrote, `limit` characters in all."""
    size = sink.seek(0, os.SEEK_END)
    half = limit // 2
    if size <= limit:
        sink.seek(0)
        return sink.read().decode("utf-8", errors="replace")
    sink.seek(0)
    head = sink.read(half).decode("utf-8", errors="replace")
    sink.seek(size - half)
    tail = sink.read(half).decode("utf-8", errors="replace")
    return head + f"\n[... {size - 2 * half} bytes cut ...]\n" + tail


def head_and_tail(text: str, limit: int) -> str:
    """`text`, or its start and its end when it is longer than `limit` (a command's last lines say how it ended)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n[... {len(text) - 2 * half} characters cut ...]\n" + text[-half:]
