"""How much a skill read from disk or from an archive may hold.

A skill is instructions and a few small files; these bounds are far above that and far below
what would hurt (a home directory given by mistake, a zip bomb). Readers take a `Limits`, so a
caller with a reason can pass others.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_files: int = 1_000
    max_file_bytes: int = 10_000_000
    max_total_bytes: int = 50_000_000


DEFAULT_LIMITS = Limits()


def size_text(n: int) -> str:
    """A byte count for people: 512 B, 4.1 kB, 10.0 MB (decimal units)."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB"):
        value /= 1000
        if value < 1000:
            return f"{value:.1f} {unit}"
    return f"{value / 1000:.1f} GB"
