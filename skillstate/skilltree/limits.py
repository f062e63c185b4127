"""How much a skill read from disk or from an archive may hold.

A skill is instructions and a few small files; these bounds are far above that and far below
what would hurt (a home directory given by mistake, a zip bomb). Readers take a `Limits`, so a
caller with a reason can pass others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skillstate.errors import UserError


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


def read_bounded(path: Path, most: int, what: str) -> bytes:
    """The bytes of the file at `path`, refused in one line when it is larger than `most` (`what` names
    the kind of thing it should be: "a skill", "a skill file") or cannot be read."""
    try:
        size = path.stat().st_size
        if size > most:
            raise UserError(f"{path}: {size_text(size)} is more than {what} may hold ({size_text(most)})")
        return path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
