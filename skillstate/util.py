"""Small deterministic helpers shared by the whole package."""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from typing import Any, TypeVar

T = TypeVar("T")

# The database when none is named (here, not in the store, so that the CLI can
# show it in --help without importing SQLAlchemy).
DEFAULT_DB = "sqlite:///skillstate.db"


def install_hint(extra: str) -> str:
    """The command that installs an extra: `pip install "skillstate[EXTRA]"`, or, where skillstate runs from a
    checkout (an editable install: pyproject.toml beside the package), `pip install -e ".[EXTRA]"` (the
    checkout's path instead of `.` when it is not the working directory)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "pyproject.toml")):
        return f'pip install "skillstate[{extra}]"'
    here = os.path.abspath(os.getcwd()) == root
    return f'pip install -e "{"." if here else root}[{extra}]"'


def first_line(value: object, default: str | None = None) -> str:
    """The first line of `str(value)` (an error's message), or `default` (else the value's type name) when
    it is blank."""
    text = str(value).strip()
    if text:
        return text.splitlines()[0]
    return default if default is not None else type(value).__name__


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace: the hashed form."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def ordered_json(value: Any) -> str:
    """JSON with keys in the order given and no insignificant whitespace: the sent form of a schema, whose
    property order is the order a constrained server (llama.cpp, vLLM) makes the model write the fields in.
    Hash `canonical_json` of its parse, never this text: the hash must not depend on key order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def hash_value(value: Any) -> str:
    return sha256_text(canonical_json(value))


def derive_seed(*parts: Any) -> int:
    """A seed that depends only on `parts` (never on PYTHONHASHSEED)."""
    digest = hashlib.sha256(canonical_json([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def seeded_rng(*parts: Any) -> random.Random:
    return random.Random(derive_seed(*parts))


def unit_float(*parts: Any) -> float:
    """A deterministic number in [0, 1) derived from `parts`."""
    return derive_seed(*parts) / 2**64


_STEP_RE = re.compile(r"^(?:step_?)?(\d+)$", re.IGNORECASE)


def parse_step(value: str | int) -> int:
    """Accept `5`, `"5"`, `"step_5"` and `"step5"`."""
    from skillstate.errors import UserError

    if isinstance(value, int):
        step = value
    else:
        match = _STEP_RE.match(str(value).strip())
        if not match:
            negative = re.match(r"^-(?:step_?)?\d+$", str(value).strip(), re.IGNORECASE)
            hint = "steps are 0 or more" if negative else "use a number like 5 or step_5"
            raise UserError(f"not a step: {value!r} ({hint})")
        step = int(match.group(1))
    if step < 0:
        raise UserError(f"not a step: {value!r} (steps are 0 or more)")
    return step


def is_step(value: str) -> bool:
    return bool(_STEP_RE.match(str(value).strip()))


RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_run_id(run_id: str) -> str:
    """A run id is 1 to 128 letters, digits, `.`, `_` or `-`: it is printed in
    tables and typed in commands (a newline or a space would break both)."""
    from skillstate.errors import UserError

    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        text = str(run_id)
        shown = repr(text) if len(text) <= 60 else repr(text[:60]) + "..."
        raise UserError(f"invalid run id {shown}: use 1 to 128 letters, digits, '.', '_' or '-'")
    return run_id


def chunked(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# A scheme starts at the first letter of a run of scheme characters (`lead` keeps the digits, `+`, `.` or `-`
# before it). The lookbehind tries each run once: unanchored, a long run without `://` (100,000 characters of
# echoed input) was scanned again from each of its characters, 20 s for one error line.
_URL_CRED_RE = re.compile(r"(?<![a-zA-Z0-9+.-])(?P<lead>[0-9+.-]*)(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_SECRET_RE = re.compile(r"\b(sk-[A-Za-z0-9_\-]{8,}|Bearer\s+[A-Za-z0-9_\-.=]{8,})")

# The secrets this process holds (each role's API key, registered where it is read), masked by `redact`
# whatever their shape: an endpoint's error may quote the key it was sent. Shorter strings are not
# registered: a key like `local` (any value for a server without auth) would shred every text it is in.
MIN_SECRET_CHARS = 8
_secrets: set[str] = set()
_secrets_re: re.Pattern[str] | None = None
_secrets_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Have `redact` mask `value` from now on, in this process (nothing when it is shorter than
    MIN_SECRET_CHARS characters, or blank)."""
    global _secrets_re
    value = (value or "").strip()
    if len(value) < MIN_SECRET_CHARS or value in _secrets:
        return
    with _secrets_lock:
        _secrets.add(value)
        longest_first = sorted(_secrets, key=len, reverse=True)  # a key inside another is masked with it
        _secrets_re = re.compile("|".join(re.escape(s) for s in longest_first))


def redact(text: str) -> str:
    """Mask credentials in URLs, API-key-looking tokens and every secret registered (`register_secret`)."""
    if _secrets_re is not None:
        text = _secrets_re.sub("***", text)
    text = _URL_CRED_RE.sub(lambda m: m.group("lead") + m.group("scheme") + "***@", text)
    return _SECRET_RE.sub("***", text)
