"""What a sandboxed command sees of the machine: an allow-list, never the machine less a hide-list.

The view starts empty and holds only:
- the system folders a toolchain needs, read-only (`SYSTEM`: /usr and the /bin, /sbin and /lib folders,
  as symlinks where the machine has them as symlinks), and of /etc only what programs read to run
  (`ETC`: users and groups, name lookup, libraries, certificates, time zone, the Java and Python
  folders...), never the files machines keep credentials in (`pip.conf`, `npmrc`, `environment`, ...);
- the Python that runs skillstate, read-only (so `python` and its pytest run), less skillstate's own
  package (the bundled tasks' reference solutions) wherever it lies under it;
- what the caller shows (an agent's program, `harness.show`), read-only;
- a private /tmp and /dev/shm, in memory, each bounded in size;
- the workspace, writable, at a fixed path, and what the caller binds in (the proxy's socket);
- its own /dev (null, zero, random, tty, ...) and /proc.

Every path the run itself names (`run_paths`: its database, data, config and skill sources) is covered
wherever it would show: a folder by an empty one, a file by an empty file. Nothing else of the machine is
there: not /home, /root, /run (its sockets), /var, /srv, /mnt, the working directory or other runs'
workspaces.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from skillstate.envs.run_paths import run_paths

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "debian_version", "fonts",
       "gai.conf", "group", "host.conf", "hostname", "hosts", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
       "locale.alias", "localtime", "lsb-release", "magic", "magic.mime", "mime.types", "mtab", "netconfig", "networks",
       "nsswitch.conf", "os-release", "passwd", "perl", "profile", "protocols", "resolv.conf", "services", "sgml",
       "shells", "ssl", "terminfo", "timezone", "xml")
ETC_PREFIXES = ("java", "python", "ld.so.")  # /etc/java-17-openjdk, /etc/python3.11, ...
INSIDE_UID = 1000  # the uid (and gid) a command has inside its sandbox, whoever runs the driver


def _under(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def python_roots() -> list[str]:
    """The folders of the Python that runs skillstate (a virtual environment and the install it is made from)."""
    out: list[str] = []
    for raw in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))):
        path = os.path.realpath(raw)
        if os.path.isdir(path) and path != "/" and path not in out:
            out.append(path)
    return out


def package_dir() -> str:
    import skillstate

    return os.path.realpath(os.path.dirname(skillstate.__file__))


def _top(paths: list[str], covered: tuple[str, ...]) -> list[str]:
    """`paths` less those inside another of them or inside `covered`, shortest first."""
    out: list[str] = []
    for path in sorted(set(paths), key=lambda p: (len(p), p)):
        if not _under(path, [*covered, *out]):
            out.append(path)
    return out


class View:
    """bubblewrap's arguments for one view, built in the order bubblewrap needs (a folder before what is bound
    inside it); `dirs` made so far, each with mode 0755 (bubblewrap run by root would make them 0700)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.dirs: set[str] = {"/"}
        self.bound: list[str] = []  # folders bound in: what is under them exists already

    def _parents(self, path: str) -> None:
        parts = Path(path).parts[1:-1]
        here = ""
        for part in parts:
            here = f"{here}/{part}"
            if _under(here, self.bound):
                return
            if here not in self.dirs:
                self.args += ["--perms", "0755", "--dir", here]
                self.dirs.add(here)

    def system(self, path: str) -> None:
        if os.path.islink(path):
            self.args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            self.args += ["--ro-bind", path, path]
            self.dirs.add(path)

    def etc(self) -> None:
        """/etc with only the entries of ETC (and those ETC_PREFIXES begin) the machine has, read-only."""
        self.args += ["--perms", "0755", "--dir", "/etc"]
        self.dirs.add("/etc")
        try:
            names = sorted(os.listdir("/etc"))
        except OSError:
            return
        for name in names:
            if name in ETC or name.startswith(ETC_PREFIXES):
                path = f"/etc/{name}"
                if os.path.islink(path):
                    self.args += ["--symlink", os.readlink(path), path]
                elif os.path.exists(path):
                    self.args += ["--ro-bind", path, path]
                    self.bound.append(path)

    def bind(self, host: str, there: str, writable: bool = False) -> None:
        self._parents(there)
        self.args += ["--bind" if writable else "--ro-bind", host, there]
        if os.path.isdir(host):
            self.dirs.add(there)
            self.bound.append(there)

    def memory_folder(self, there: str, size_mb: int) -> None:
        self._parents(there)
        self.args += ["--perms", "1777", "--size", str(size_mb * 1024 * 1024), "--tmpfs", there]
        self.dirs.add(there)

    def cover(self, path: str) -> None:
        """Hide `path`, shown by a bind above it: a folder by an empty one, a file by an empty file."""
        if os.path.isdir(path) and not os.path.islink(path):
            self.args += ["--perms", "0755", "--tmpfs", path]
        elif os.path.lexists(path):
            self.args += ["--ro-bind", "/dev/null", path]


def view_args(workspace: str, at: str, *, shown: list[str] | None = None, binds: dict[str, str] | None = None,
              readonly: dict[str, str] | None = None, tmp_mb: int = 512) -> list[str]:
    """The view's bubblewrap arguments: the workspace (host path) writable at `at`, `shown` read-only, each of
    `binds` (host path -> path inside) bound in writable, each of `readonly` read-only (over the workspace's
    own files, say)."""
    view = View()
    for path in SYSTEM:
        view.system(path)
    view.etc()
    view.memory_folder("/tmp", tmp_mb)
    view.args += ["--dev", "/dev"]
    view.dirs.add("/dev")
    view.memory_folder("/dev/shm", tmp_mb)
    system = tuple(p for p in SYSTEM if os.path.isdir(p) and not os.path.islink(p))
    wanted = [*python_roots(), *(os.path.realpath(p) for p in (shown or []) if os.path.exists(p))]
    roots = _top([p for p in wanted if p != "/"], system)
    for path in roots:
        view.bind(path, path)
    shown_roots = [*system, *view.bound, *roots]  # /etc's entries among them: a run path there is covered too
    for path in sorted({package_dir(), *run_paths()}):
        if _under(path, shown_roots) and os.path.lexists(path):
            view.cover(path)
    view.bind(workspace, at, writable=True)
    for host, there in (binds or {}).items():
        view.bind(host, there, writable=True)
    for host, there in (readonly or {}).items():
        view.bind(host, there)
    return [*view.args, "--proc", "/proc"]
