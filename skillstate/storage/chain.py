"""The hash chain of a log, checked: sequence, links, hashes, signatures and
readability. `audit` reports what this finds; `load_run` refuses to fold (and
so to resume, replay or verify) a log that fails it."""

from __future__ import annotations

import hmac

from skillstate.log.events import Event
from skillstate.storage.store import GENESIS, StoredEvent, event_hash, event_mac


def label(s: StoredEvent) -> str:
    return f"run {s.run_id} event {s.seq} ({s.type})"


def check_chain(stored: list[StoredEvent], first_prev: str = GENESIS, *, key: str | None = None,
                require_mac: bool = False, first_seq: int = 1) -> tuple[list[Event], str | None]:
    """The decoded events, and the first problem found (None if none).

    `stored` is one run's own events, or a whole lineage (a fork's parent
    prefix, then its own events): sequence numbers restart at 1 where a new
    run begins, and every event links to the one before it. With `key`, a
    signature that is present must match; with `require_mac` too, every
    event must carry one. `first_seq` and `first_prev` check a run's events
    from the middle of its log on (those after an event already checked)."""
    decoded: list[Event] = []
    prev, run, expected = first_prev, None, 0
    for s in stored:
        if s.run_id != run:
            run, expected = s.run_id, (first_seq - 1 if run is None else 0)
        expected += 1
        if s.seq != expected:
            return decoded, f"run {s.run_id} event {s.seq}: sequence is not contiguous (expected {expected})"
        if s.prev_hash != prev:
            return decoded, f"{label(s)}: prev_hash does not match the event before it"
        if event_hash(s.prev_hash, s.run_id, s.seq, s.type, s.version, s.payload) != s.hash:
            return decoded, f"{label(s)}: hash mismatch (the stored event was altered)"
        if key is not None:
            if s.mac is None and require_mac:
                return decoded, f"{label(s)}: not signed with the audit key"
            if s.mac is not None and not hmac.compare_digest(s.mac, event_mac(key, s.hash)):
                return decoded, f"{label(s)}: signature mismatch (altered, or signed with another key)"
        try:
            decoded.append(s.event)
        except Exception as err:  # unknown type, unreadable payload
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return decoded, f"{label(s)}: cannot be read: {reason}"
        prev = s.hash
    return decoded, None
