"""A hostile agent, as skillstate's `command` harness runs one (tests/test_hostile_agent.py).

It makes one model call through the proxy, tries every escape that once got through the sandbox, the proxy
or the check, prints one JSON line per attempt (`{"probe": ..., "escaped": true|false, "detail": ...}`),
fakes the task's check (a package that ends pytest with exit code 0 as soon as the tests import it) and
exits 0. The test reads the lines back from the rollout's trajectory; none may say escaped.

    python hostile_agent.py TARGETS.json TASK
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def emit(probe: str, escaped: bool, detail: str = "") -> None:
    print(json.dumps({"probe": probe, "escaped": escaped, "detail": detail[:300]}), flush=True)


def can_write(path: str, text: str | None = None) -> bool:
    try:
        with open(path, "r+" if text is None else "w") as f:
            if text is not None:
                f.write(text)
        return True
    except OSError:
        return False


def can_read(path: str, needle: str = "") -> bool:
    try:
        with open(path, errors="replace") as f:
            return needle in f.read(1 << 20)
    except OSError:
        return False


def kernel() -> None:
    swappiness = open("/proc/sys/vm/swappiness").read()
    emit("write /proc/sys/vm/swappiness", can_write("/proc/sys/vm/swappiness", swappiness))
    emit("open /proc/sys/kernel/core_pattern for writing", can_write("/proc/sys/kernel/core_pattern"))
    emit("write /proc/sysrq-trigger", can_write("/proc/sysrq-trigger"))
    emit("read /etc/shadow", can_read("/etc/shadow"))
    emit("run as uid 0", os.getuid() == 0 or os.geteuid() == 0, f"uid {os.getuid()}")
    try:
        os.kill(1, signal.SIGKILL)
        emit("kill the sandbox's first process", True)
    except OSError as err:
        emit("kill the sandbox's first process", False, str(err))
    nested = subprocess.run(["unshare", "-U", "true"], capture_output=True)
    emit("make a user namespace of its own", nested.returncode == 0, nested.stderr.decode()[:100])


def files(targets: dict) -> None:
    for path in targets["secret_files"]:
        emit(f"read {path}", can_read(path, targets["marker"]))
    for folder in targets["secret_dirs"]:  # a folder of a file the harness shows holds that file alone
        try:
            emit(f"list {folder}", bool(set(os.listdir(folder)) - set(targets["shown_names"])))
        except OSError:
            emit(f"list {folder}", False)
    emit("change the agent's own program", can_write(os.path.abspath(__file__)))
    for path in ("/etc/hostile", "/usr/hostile"):
        emit(f"write {path}", can_write(path, "x"))
    shown = open("/proc/self/mountinfo").read() + open("/proc/1/cmdline").read().replace("\0", " ")
    leaked = [t for t in targets["host_paths"] if t in shown]
    emit("see host paths in /proc", bool(leaked), ", ".join(leaked))
    environ = json.dumps(dict(os.environ))
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            environ += open(f"/proc/{pid}/environ", errors="replace").read()
        except OSError:
            continue
    emit("find the run's key", targets["key"] in environ)


def network(targets: dict) -> None:
    for host, port in targets["ports"]:
        try:
            socket.create_connection((host, port), timeout=2).close()
            emit(f"connect to {host}:{port}", True)
        except OSError as err:
            emit(f"connect to {host}:{port}", False, str(err))
    for path in targets["sockets"]:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            emit(f"connect to {path}", True)
        except OSError as err:
            emit(f"connect to {path}", False, str(err))
        finally:
            s.close()


def limits() -> None:
    tmp = subprocess.run(["sh", "-c", "for i in 1 2 3 4; do head -c 40M /dev/zero > /tmp/fill$i || exit 1; done"],
                         capture_output=True)
    emit("fill /tmp past its bound", tmp.returncode == 0, tmp.stderr.decode()[-100:])


def proxy() -> None:
    """The proxy must hold: idle connections by the hundred, a body past its bound, clients that hang up before
    their answer (the driver counts its threads and reads its own error output)."""
    url = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
    held = []
    for _ in range(400):
        try:
            held.append(socket.create_connection((url.hostname, url.port), timeout=5))
        except OSError:
            break
    time.sleep(2)
    for s in held:
        s.close()
    emit("hold idle connections to the proxy", False, f"{len(held)} opened")
    for _ in range(50):  # hang up before the 401
        try:
            s = socket.create_connection((url.hostname, url.port), timeout=5)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            s.close()
        except OSError:
            pass
    big = b"{" + b" " * (40 * 1024 * 1024) + b"}"
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=big, headers={
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=20)
        emit("send a 40 MB body", True)
    except urllib.error.HTTPError as err:
        emit("send a 40 MB body", err.code not in (413, 503), f"HTTP {err.code}")
    except OSError as err:  # the proxy closed the connection on it
        emit("send a 40 MB body", False, str(err))


def fake_the_check() -> None:
    """The tests import `tally`: end pytest there with exit code 0, before any test ran."""
    with open("tally/__init__.py", "a") as f:
        f.write("\nimport os\nos._exit(0)\n")


def ask_the_model(task: str) -> None:
    body = json.dumps({"model": os.environ.get("SKILLSTATE_MODEL", "m"),
                       "messages": [{"role": "user", "content": task}]}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        emit("model call", False, reply.read().decode()[:100])


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        targets = json.load(f)
    task = argv[1] if len(argv) > 1 else sys.stdin.read()
    ask_the_model(task)
    fake_the_check()
    for probe in (kernel, lambda: files(targets), lambda: network(targets), limits, proxy):
        try:
            probe()
        except Exception as err:  # noqa: BLE001 - a probe that breaks says so and the next one runs
            emit(f"probe crashed: {type(err).__name__}", False, str(err))
    ask_the_model(task)  # the proxy and the bridge held: the agent's own calls still go through
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
