"""Running a command in a task's workspace, sandboxed with bubblewrap.

A workspace task's agent runs shell commands, and its check runs the project's tests, so both run in
a sandbox: Debian's `bubblewrap` (`bwrap`) gives the command a read-only view of the machine with the
workspace the only writable directory (and a private `/tmp`), no network (its own empty network
namespace), its own process namespace (so nothing it starts outlives it), and these limits:
- `wall_seconds`: the whole command is killed when it runs longer;
- `memory_mb`: its address space (`RLIMIT_AS`);
- `max_processes`: tasks (processes and threads) it may start: for an ordinary user, beyond those
  the user has (`RLIMIT_NPROC` counts every task of the user; commands that run at the same time
  share that headroom while it lasts); for root, whom that limit does not bind, in a pids cgroup
  of its own (cgroup v1's pids controller, where it is writable; where it is not, root's commands
  have no process limit, and a command that forks without end is stopped at its time limit).

What went wrong is reported in the result, never raised: a command that cannot start, times out or
is killed is an outcome the agent (or the check) reads. `sandbox: none` runs the command without
bubblewrap, with the same limits but no isolation: only on a user's explicit choice.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from skillstate.errors import ConfigError

MAX_OUTPUT = 20_000  # characters of a command's output kept
KILL_GRACE = 15.0  # seconds a killed sandbox gets to close its output
MAX_FILE_BYTES = 64 * 1024 * 1024  # the largest file a command may write (RLIMIT_FSIZE), its output included


class SandboxSettings(BaseModel):
    """`env_config.sandbox` of a workspace environment."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["bwrap", "none"] = Field(
        "bwrap", description="bwrap: commands run under bubblewrap (Debian's bubblewrap package); none: without "
                             "isolation, only when you choose it (the run's log records the choice)")
    wall_seconds: float = Field(60.0, gt=0, le=3600, description="Kill a command that runs longer (seconds).")
    memory_mb: int = Field(2048, ge=64, le=1_048_576, description="Address space a command may use (MB).")
    max_processes: int = Field(256, ge=8, le=65_536, description="Processes the sandbox's user may have at once.")


@dataclass(frozen=True)
class CommandResult:
    """What a command did: its exit code (None when it never finished), its output (stdout and stderr, in
    order, clipped), and whether it ran out of time."""

    exit_code: int | None
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        if self.timed_out:
            return "killed: it ran past the time limit"
        if self.exit_code is None:
            return "it could not start"
        if self.exit_code < 0:
            return f"killed by signal {-self.exit_code}"
        return f"exit code {self.exit_code}"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def check_sandbox(settings: SandboxSettings) -> None:
    """A one-line ConfigError when the sandbox the settings ask for cannot start here."""
    if settings.kind == "none":
        return
    path = bwrap_path()
    if path is None:
        raise ConfigError("the workspace sandbox needs bubblewrap (apt install bubblewrap); to run commands "
                          "without isolation, set env_config.sandbox.kind: none")
    probe = Path(os.environ.get("TMPDIR", "/tmp"))
    result = run_command("true", probe, settings)
    if not result.ok:
        raise ConfigError(f"bubblewrap cannot start a sandbox here ({result.summary()}: "
                          f"{result.output.strip().splitlines()[-1] if result.output.strip() else 'no output'}); "
                          "to run commands without isolation, set env_config.sandbox.kind: none")


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


PIDS_CGROUP = Path("/sys/fs/cgroup/pids")  # cgroup v1's pids controller, where a root driver can bound a command


def pids_group(limit: int) -> Path | None:
    """A new pids cgroup that holds at most `limit` tasks, for a driver running as root (whom RLIMIT_NPROC does
    not bind); None where there is no writable pids controller."""
    if os.geteuid() != 0 or not (PIDS_CGROUP / "cgroup.procs").exists():
        return None
    group = PIDS_CGROUP / "skillstate" / f"cmd-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir(parents=True)
    except OSError:
        return None
    try:
        (group / "pids.max").write_text(str(limit))
    except OSError:
        _drop_group(group)
        return None
    return group


def _drop_group(group: Path | None) -> None:
    if group is None:
        return
    deadline = time.monotonic() + KILL_GRACE
    while True:
        try:
            group.rmdir()
            return
        except OSError:  # tasks still leaving
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def _limits(settings: SandboxSettings, before: int, group: Path | None):
    processes = before + settings.max_processes  # the headroom this command gets

    def apply() -> None:
        os.setsid()
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        memory = settings.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def hidden_paths() -> list[str]:
    """What a sandboxed command may not read although the machine is visible: the driver's home and working
    directories (the run's database, the user's keys) and skillstate's own package (the bundled tasks'
    reference solutions); the Python that runs skillstate is shown again inside them."""
    import skillstate

    out = []
    for raw in (os.path.expanduser("~"), os.getcwd(), os.path.dirname(os.path.dirname(skillstate.__file__)),
                tempfile.gettempdir()):  # other rollouts' workspaces, where TMPDIR is not /tmp
        path = os.path.realpath(raw)
        if path not in ("/", "/usr", "/tmp", "/bin", "/lib") and path not in out:
            out.append(path)
    return out


def socket_dirs() -> list[str]:
    """Where the machine's Unix sockets are (a database's, a session bus, an agent's keys): hidden, since a
    read-only file system does not stop a connect. /run always; and the folder of each socket listening
    elsewhere (`/proc/net/unix`), outside /tmp (private already) and the system's own folders."""
    out = ["/run"] if os.path.isdir("/run") else []
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    keep = ("/", "/usr", "/bin", "/lib", "/lib64", "/etc", "/var", "/dev", "/proc", "/sys", "/tmp")
    for line in lines:
        parts = line.split()
        path = parts[7] if len(parts) > 7 else ""
        if not path.startswith("/"):  # abstract sockets: the sandbox's own network namespace has none of them
            continue
        folder = os.path.dirname(os.path.realpath(path))
        if folder in keep or folder.startswith(("/tmp/", "/run/", "/proc/", "/sys/", "/dev/")) or folder in out:
            continue
        if any(p == folder or p.startswith(folder + "/") for p in _python_prefixes()):
            continue
        out.append(folder)
    return sorted(out)


def _python_prefixes() -> set[str]:
    return {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))}


def _shown_again(masked: list[str]) -> list[str]:
    """The Python installs inside a hidden path, bound back so that `python` still runs."""
    out = []
    for prefix in _python_prefixes():
        if any(prefix == m or prefix.startswith(m + "/") for m in masked) and prefix not in out:
            out.append(prefix)
    return sorted(out)


def bwrap_argv(workspace: Path, inside: str | None = None, binds: dict[str, str] | None = None,
               shown: list[str] | None = None, home: str | None = None) -> list[str]:
    """bubblewrap's arguments: the machine read-only (less `hidden_paths`, with `shown` ones bound back), a
    private /tmp, the workspace writable and current (at `inside`, a path under /tmp, when given: the same path
    in every rollout), each of `binds` (host path -> path inside) bound in; HOME is the workspace unless `home`."""
    ws = str(workspace.resolve())
    at = inside or ws
    masked = [p for p in hidden_paths() if not (ws == p or (ws.startswith(p + "/") and inside is None)
                                                 or p.startswith("/tmp/"))]
    masks = [arg for p in [*masked, *socket_dirs()] for arg in ("--tmpfs", p)]
    prefixes = _shown_again([*masked, "/tmp"])
    again = [arg for p in [*prefixes, *_still_hidden(shown or [], [*masked, "/tmp"], prefixes)]
             for arg in ("--ro-bind", p, p)]
    extra = [arg for host, there in (binds or {}).items() for arg in ("--bind", host, there)]
    return ["bwrap", "--ro-bind", "/", "/", "--tmpfs", "/tmp", *masks, *again, "--bind", ws, at, *extra,
            "--dev", "/dev", "--proc", "/proc",
            "--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--chdir", at,
            "--setenv", "HOME", home or at, "--setenv", "TMPDIR", "/tmp", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--setenv", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1", "--"]


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _still_hidden(shown: list[str], masked: list[str], prefixes: list[str]) -> list[str]:
    """Of the paths to show again, those the sandbox would hide otherwise: under a masked path, and under neither
    a Python shown again nor another of them (bubblewrap cannot bind over a path a read-only bind holds)."""
    out: list[str] = []
    for path in sorted(set(shown), key=len):
        if _under(path, masked) and not _under(path, [*prefixes, *out]):
            out.append(path)
    return out


def run_command(command: str, workspace: Path, settings: SandboxSettings, inside: str | None = None) -> CommandResult:
    """Run `command` (a shell command line) in `workspace` under the sandbox the settings name. `python` on its
    PATH is the Python that runs skillstate."""
    return run_sandboxed(["/bin/sh", "-c", command], workspace, settings, inside)


def run_sandboxed(argv: list[str], workspace: Path, settings: SandboxSettings, inside: str | None = None, *,
                  env: dict[str, str] | None = None, binds: dict[str, str] | None = None,
                  shown: list[str] | None = None, stdin: str | None = None, wall_seconds: float | None = None,
                  max_output: int = MAX_OUTPUT, stop: threading.Event | None = None) -> CommandResult:
    """Run `argv` in `workspace` under the sandbox the settings name, with `env` added to its environment and
    `stdin` as its input; `wall_seconds` and `max_output` replace the settings' time limit and the output kept;
    once `stop` is set the command is killed (its result says it was stopped)."""
    home = (env or {}).get("HOME")
    full = [*bwrap_argv(workspace, inside, binds, shown, home), *argv] if settings.kind == "bwrap" else argv
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
    base = {"PATH": path, "LANG": "C.UTF-8", "HOME": str(workspace), "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # pytest itself, not every plugin installed beside skillstate
    limits = settings if wall_seconds is None else settings.model_copy(update={"wall_seconds": wall_seconds})
    before = processes_of(os.geteuid())
    group = pids_group(settings.max_processes)
    try:
        return _run(full, workspace, {**base, **(env or {})}, limits, before, group, stdin, max_output, stop)
    finally:
        _drop_group(group)


def _run(argv: list[str], workspace: Path, env: dict[str, str], settings: SandboxSettings, before: int,
         group: Path | None, stdin: str | None = None, max_output: int = MAX_OUTPUT,
         stop: threading.Event | None = None) -> CommandResult:
    with tempfile.TemporaryFile() as sink, tempfile.TemporaryFile() as source:
        source.write((stdin or "").encode())
        source.seek(0)
        try:  # the output goes to a file (RLIMIT_FSIZE bounds it), read head and tail
            proc = subprocess.Popen(argv, cwd=workspace, env=env,
                                    stdin=source if stdin is not None else subprocess.DEVNULL, stdout=sink,
                                    stderr=subprocess.STDOUT, preexec_fn=_limits(settings, before, group))
        except (OSError, ValueError, subprocess.SubprocessError) as err:  # a NUL in the command, say
            return CommandResult(None, f"cannot start: {getattr(err, 'strerror', None) or err}")
        try:
            _wait(proc, settings.wall_seconds, stop)
        except subprocess.TimeoutExpired:
            _kill(proc)
            try:  # the sandbox's namespace goes with it; a fork storm can take a few seconds to wind down
                proc.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                pass
            _wait_gone(before + settings.max_processes // 4)  # its processes no longer count against the next
            return CommandResult(None, _read_clipped(sink, max_output), timed_out=True)
        if stop is not None and stop.is_set() and proc.returncode is not None and proc.returncode < 0:
            return CommandResult(None, _read_clipped(sink, max_output) + "\n[stopped: the run stopped taking calls]")
        return CommandResult(proc.returncode, _read_clipped(sink, max_output))


def _wait(proc: subprocess.Popen, seconds: float, stop: threading.Event | None) -> None:
    """Wait for `proc` for up to `seconds` (TimeoutExpired after); kill it as soon as `stop` is set."""
    if stop is None:
        proc.wait(timeout=seconds)
        return
    deadline = time.monotonic() + seconds
    while proc.poll() is None:
        if stop.is_set():
            _kill(proc)
            proc.wait(timeout=KILL_GRACE)
            return
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, seconds)
        stop.wait(0.05)


def _wait_gone(at_most: int) -> None:
    """Wait (up to KILL_GRACE seconds) until the user has at most `at_most` processes again."""
    deadline = time.monotonic() + KILL_GRACE
    while processes_of(os.geteuid()) > at_most and time.monotonic() < deadline:
        time.sleep(0.05)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its session: bwrap and everything under it
    except (ProcessLookupError, PermissionError):
        proc.kill()


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
