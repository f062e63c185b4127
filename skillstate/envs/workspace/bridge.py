"""Inside the sandbox: serve the proxy's Unix socket on 127.0.0.1, then run the agent.

The sandbox has a network namespace of its own with only a loopback device, so the agent can reach
nothing but what listens inside it. This program (standard library only: the sandbox hides
skillstate's package, so it runs as `python -c SOURCE`) listens on 127.0.0.1:PORT, relays each
connection to the proxy's socket bound into the sandbox (at most MAX_RELAYS at once, as the proxy
serves no more; an agent that holds them all, or leaves the sandbox no thread to start, has its next
connections closed, and the bridge goes on), makes the directories the agent needs, and runs the
agent's command, with its exit code as its own.

    python -c SOURCE SOCKET PORT DIR[:DIR...] -- ARGV...
"""

import os
import socket
import subprocess
import sys
import threading


def _pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _relay(conn, path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
    except (OSError, RuntimeError):
        conn.close()
        upstream.close()
        return
    _pump(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


MAX_RELAYS = 32  # connections relayed at once (the proxy takes no more): past it a connection is closed


def _relay_bounded(conn, path, slots):
    try:
        _relay(conn, path)
    finally:
        slots.release()


def _serve(listener, path):
    slots = threading.BoundedSemaphore(MAX_RELAYS)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        if not slots.acquire(blocking=False):  # the agent holds every relay already: not this one
            conn.close()
            continue
        try:
            threading.Thread(target=_relay_bounded, args=(conn, path, slots), daemon=True).start()
        except RuntimeError:  # no thread left to the sandbox: this connection is refused, the next may pass
            slots.release()
            conn.close()


def main(argv):
    path, port, dirs = argv[0], int(argv[1]), argv[2]
    command = argv[argv.index("--") + 1:]
    for d in filter(None, dirs.split(":")):
        os.makedirs(d, exist_ok=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        return subprocess.call(command)
    except OSError as err:
        print(f"skillstate: cannot run {command[0]!r}: {err.strerror or err}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
