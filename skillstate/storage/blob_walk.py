"""Walking the blobs a set of roots names, and the blobs those name in turn.

One walker for every reader that needs a run's blobs transitively:
`skillstate db copy` (what to copy) and `audit`, `resume`, `replay --verify`
and `fork` (what to check before trusting or appending to a log).

A blob's text "names" every 64-digit hex string in it that is the key of a
stored blob: a results blob names the trajectories of its items. That is a
superset of the typed references (it also finds journaled request hashes,
which are not blobs: those are in `mentioned` and not in `found`). Each
distinct blob is read, decompressed and rehashed once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from skillstate.errors import CorruptLogError
from skillstate.log.events import Event
from skillstate.skilltree.blobs import is_tree_blob
from skillstate.skilltree.blobs import manifest_entries as tree_manifest_of
from skillstate.storage.chain import label
from skillstate.storage.schema import blobs
from skillstate.storage.store import BlobDamaged, Store, StoredEvent, read_blob

IN_CHUNK = 900  # values per IN (...) list, under SQLite's parameter limit

_HEX_RUN = re.compile(r"[0-9a-f]{64,}")  # maximal runs: faster than look-arounds, the same hashes
_BLOB_ROWS = select(blobs.c.hash, blobs.c.size, blobs.c.data).where(
    blobs.c.hash.in_(bindparam("hashes", expanding=True)))


def hashes_in(texts: Iterable[str]) -> set[str]:
    """Every 64-digit hex string in `texts` (candidate blob and request hashes)."""
    out: set[str] = set()
    for text in texts:
        out.update(h for h in _HEX_RUN.findall(text) if len(h) == 64)
    return out


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@dataclass
class BlobWalk:
    """What a walk found, each blob reached from the root it was first reached from."""

    rows: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # found: hash -> (size, data) as stored
    damaged: dict[str, str] = field(default_factory=dict)  # found but unreadable: hash -> what is wrong
    missing: dict[str, str] = field(default_factory=dict)  # required inside a blob, not there: hash -> that blob
    mentioned: set[str] = field(default_factory=set)  # every hash the roots and the blobs' texts hold
    root_of: dict[str, str] = field(default_factory=dict)  # hash -> the root it was first reached from
    named_in: dict[str, str] = field(default_factory=dict)  # a nested hash -> the blob that first named it


def walk_blobs(conn: Connection, roots: Iterable[str], *,
               required_in: Callable[[str, str], Iterable[str]] | None = None) -> BlobWalk:
    """Read every blob `roots` name, transitively, in batches.

    A blob that does not read back as the text its key names is recorded in
    `damaged` (what it names is then unknown). With `required_in(hash, text)`,
    the hashes it returns for a blob must be stored blobs: those that are not
    are recorded in `missing` (a hex string that is not a blob is otherwise
    taken for a request hash or plain text)."""
    walk = BlobWalk()
    frontier = list(dict.fromkeys(roots))
    walk.mentioned.update(frontier)
    walk.root_of.update((h, h) for h in frontier)
    looked: set[str] = set()
    required: dict[str, str] = {}  # hash -> the blob that requires it

    def reached(inner: str, parent: str, nested: list[str]) -> None:
        if inner not in walk.root_of:
            walk.root_of[inner], walk.named_in[inner] = walk.root_of[parent], parent
            walk.mentioned.add(inner)
            nested.append(inner)

    while frontier:
        batch = sorted(set(frontier) - looked)
        looked.update(batch)
        nested: list[str] = []
        for chunk in chunks(batch, IN_CHUNK):
            for h, size, data in conn.execute(_BLOB_ROWS, {"hashes": chunk}):
                data = bytes(data)
                walk.rows[h] = (size, data)
                try:
                    text = read_blob(h, data)
                except BlobDamaged as err:
                    walk.damaged[h] = err.reason
                    continue
                for inner in sorted(hashes_in([text])):
                    reached(inner, h, nested)
                if required_in is not None:
                    for inner in required_in(h, text):
                        required.setdefault(inner, h)
                        reached(inner, h, nested)
        frontier = nested
    # every required hash was looked up (it was reached): those not found are missing
    walk.missing.update((h, parent) for h, parent in required.items() if h not in walk.rows)
    return walk


def trajectories_in(text: str) -> list[str]:
    """The trajectory blobs a results blob (a JSON list of item results) names."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    return [t for item in items if isinstance(item, dict) and isinstance(t := item.get("trajectory"), str)]


def tree_files_in(text: str) -> list[str]:
    """The file blobs a skill tree blob names (a run that trains a directory records each skill so)."""
    if not is_tree_blob(text):
        return []
    try:
        return sorted({e["blob"] for e in tree_manifest_of(text).values()})
    except CorruptLogError:
        return []


def blob_damage(store: Store, stored: list[StoredEvent], decoded: list[Event]) -> str | None:
    """The first problem with the blobs `stored` (events, decoded as `decoded`)
    depend on, in log order, or None: a blob an event names, or a trajectory
    its results blob names, that is missing, cut, bit-flipped or altered; and
    any other blob those texts name that is damaged."""
    first: dict[str, int] = {}  # blob -> the position of the first event that names it
    results: set[str] = set()
    for i, ev in enumerate(decoded):
        for h in ev.blob_refs():
            first.setdefault(h, i)
        if isinstance(named := getattr(ev, "results", None), str):
            results.add(named)
    if not first:
        return None
    with store.engine.connect() as conn:
        walk = walk_blobs(conn, first, required_in=lambda h, text: trajectories_in(text) if h in results
                          else tree_files_in(text))
    found: list[tuple[int, str]] = []

    def note(h: str, what: str) -> None:
        at = first[walk.root_of[h]]
        inside = f" (named in blob {walk.named_in[h][:12]})" if h in walk.named_in else ""
        found.append((at, f"{label(stored[at])}: blob {h[:12]}{inside} {what}"))

    for h in first:
        if h not in walk.rows:
            note(h, "is missing")
    for h in walk.missing:
        note(h, "is missing")
    for h, reason in walk.damaged.items():
        note(h, reason)
    return min(found)[1] if found else None
