"""Ctrl-C is never lost (`skillstate.cli.interrupts`): a SIGINT that Python
swallows because it landed in a garbage-collector callback still ends the
block with KeyboardInterrupt, with nothing printed about the swallowed one.
The real-process test is in test_inputs_boundaries.py (7)."""

from __future__ import annotations

import os
import signal
import sys
import weakref

import pytest

from skillstate.cli.interrupts import caught_interrupts


class _Thing:
    pass


def _interrupt_inside_a_callback() -> None:
    """Drop an object whose weak-reference callback receives SIGINT: Python reports the
    KeyboardInterrupt raised there as unraisable and goes on."""
    def callback(_ref: weakref.ref) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(10_000))  # the signal is handled here, inside the callback

    thing = _Thing()
    ref = weakref.ref(thing, callback)
    del thing
    assert ref() is None


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_sigint_swallowed_in_a_callback_still_interrupts_and_prints_nothing(capsys):
    before = signal.getsignal(signal.SIGINT)
    reached = False
    with pytest.raises(KeyboardInterrupt), caught_interrupts():
        _interrupt_inside_a_callback()
        reached = True  # the block went on: Python swallowed the interrupt
    assert reached
    assert "Exception ignored" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # put back


def test_a_block_without_a_sigint_ends_normally():
    with caught_interrupts():
        value = 1
    assert value == 1
