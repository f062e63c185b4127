"""Ctrl-C that is never lost.

Python turns SIGINT into a KeyboardInterrupt raised in whatever code runs at
that moment. When that is a weak-reference callback or a `__del__` (the
garbage collector runs them at any time), the exception is printed as
"ignored" and the command carries on as if nothing had happened: a long
`run` or `eval` would then finish and exit 0 although the user asked it to
stop. `caught_interrupts` records every SIGINT as well as raising it, and
raises KeyboardInterrupt again when the block ends normally after one was
seen, so the command exits as interrupted (130) either way, without the
"Exception ignored" traceback on stderr.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def caught_interrupts() -> Iterator[None]:
    """Within the block, a SIGINT raises KeyboardInterrupt as usual and is
    also remembered; one that was swallowed is raised when the block ends.
    Nothing changes where SIGINT is ignored (a parent chose so) or off the
    main thread (signals cannot be handled there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield
        return
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    def unraisable(info: sys.UnraisableHookArgs) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt) and seen:  # ours: raised again when the block ends
            return
        hook(info)

    hook = sys.unraisablehook
    signal.signal(signal.SIGINT, handler)
    sys.unraisablehook = unraisable
    try:
        yield
        if seen:
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook
