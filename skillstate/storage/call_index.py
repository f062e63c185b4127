"""Which requests a run's scope holds a successful call for, kept in memory
so that a claim asks the journal only when the answer can be yes.

The index is a hint, never the truth: a request it lacks is sent, and the
commit that journals the reply checks for an earlier successful call that
another process recorded meanwhile (`CallJournal.record_call` with
`check`); that call's reply is then the one used, as resume and verify will
serve it. A request the index holds is still read from the journal.

It keeps 64-bit prefixes of the hashes (a false "maybe" costs one lookup):
those present when the index was read in a sorted array, and those recorded
or found since in a set. `refresh` (at a stage's start, at most every
REFRESH_SECONDS; not within a stage) reads the rows added since the last
read, by id (and the last _LATE_ROWS ids again, for rows that committed late).
"""

from __future__ import annotations

import hashlib
import threading
import time
from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, select

from skillstate.storage.schema import llm_calls

if TYPE_CHECKING:
    from skillstate.storage.call_journal import CallJournal

# The most answered requests an index holds (8 bytes each, about 45 MB more while the first read sorts them);
# past that, every claim asks the journal.
MAX_INDEXED_CALLS = 1_000_000
# A refresh reads again this many row ids below the highest it has read: on PostgreSQL, a row committed after
# one with a higher id (ids are taken at insert, not at commit) is still found unless it lags that far.
_LATE_ROWS = 10_000
# How often a stage's start reads what other processes journaled (a request they answered since is sent again,
# and its reply checked in the commit: paid twice, never served wrong).
REFRESH_SECONDS = 5.0
# Requests added since the last full sort that are merged into the array at a refresh.
_MERGE_AT = 50_000

_OK_SINCE = (select(llm_calls.c.id, llm_calls.c.request_hash)
             .where(llm_calls.c.ok.is_(True), llm_calls.c.id > bindparam("after")).order_by(llm_calls.c.id))
_OK_SINCE_IN_RUNS = _OK_SINCE.where(llm_calls.c.run_id.in_(bindparam("run_ids", expanding=True)))


def hash_key(request_hash: str) -> int:
    """The 64 bits of a request hash the index keeps: the first 16 hex digits of a SHA-256 (what every
    request's hash is), else a BLAKE2b digest of the text (a key made elsewhere, as tests do)."""
    try:
        return int(request_hash[:16], 16)
    except ValueError:
        return int.from_bytes(hashlib.blake2b(request_hash.encode(), digest_size=8).digest(), "big")


class CallIndex:
    """The requests with a successful call in `run_ids` (None: any run)."""

    def __init__(self, store: CallJournal, run_ids: list[str] | None):
        self.store = store
        self.run_ids = None if run_ids is None else list(run_ids)
        self.usable = True  # False: too many requests to hold; every claim asks the journal
        self._sorted = array("Q")
        self._added: set[int] = set()
        self._after = 0  # the highest row id read
        self._lock = threading.Lock()  # one refresh at a time
        self._read_at = 0.0  # time.monotonic() of the last read
        self.refresh()

    def may_hold(self, request_hash: str) -> bool:
        """False only when the journal held no successful call of it at the last read and none was added since."""
        return not self.usable or self._holds(hash_key(request_hash))

    def _holds(self, key: int) -> bool:
        if key in self._added:
            return True
        keys = self._sorted
        i = bisect_left(keys, key)
        return i < len(keys) and keys[i] == key

    def add(self, request_hash: str) -> None:
        """A successful call of this request was just journaled (a set's add is atomic under the GIL)."""
        self._added.add(hash_key(request_hash))

    def refresh(self, *, at_most_every: float = 0.0) -> None:
        """Read the successful calls journaled since the last read (by any process), unless the last read
        was less than `at_most_every` seconds ago."""
        with self._lock:
            if not self.usable or time.monotonic() - self._read_at < at_most_every:
                return
            self._read_at = time.monotonic()
            first = self._after == 0
            params: dict[str, object] = {"after": max(0, self._after - _LATE_ROWS)}
            if self.run_ids is not None:
                params["run_ids"] = self.run_ids
            query = _OK_SINCE if self.run_ids is None else _OK_SINCE_IN_RUNS
            read = array("Q")
            room = MAX_INDEXED_CALLS - len(self)
            with self.store.engine.connect() as conn:
                result = conn.execution_options(stream_results=True, yield_per=10_000).execute(query, params)
                for row_id, request_hash in result:
                    self._after = max(self._after, row_id)
                    key = hash_key(request_hash)
                    if not first and self._holds(key):  # the late window, read again
                        continue
                    read.append(key)
                    if len(read) > room:  # too many to hold: stop reading, and ask the journal from now on
                        self.usable = False
                        self._sorted, self._added = array("Q"), set()
                        return
            if first:  # the bulk of it: sorted straight into the array
                self._sorted = array("Q", _distinct(sorted(read)))
                return
            self._added.update(read)
            if len(self._added) >= _MERGE_AT:
                moved = set(self._added)  # a copy: add() may run on other threads meanwhile
                self._sorted = array("Q", _distinct(sorted(moved.union(self._sorted))))  # readers: old or new
                self._added.difference_update(moved)  # only once the array holds them

    def __len__(self) -> int:
        return len(self._sorted) + len(self._added)


def _distinct(keys: list[int]) -> list[int]:
    """A sorted list without its repeats."""
    return [k for n, k in enumerate(keys) if n == 0 or k != keys[n - 1]]
