"""The failed LLM calls of a run, counted from its events.

Every event records the calls it depended on (`CallRef`, with the error of a
failed call); evaluation events keep theirs in the results blob. A failed
call that a resume later redid successfully is not counted: what counts is
what the run's events saw.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select

from skillstate.llm.embeddings import ROLE as EMBEDDER
from skillstate.log.events import CallRef, Event
from skillstate.log.reducer import stage_of
from skillstate.storage.schema import llm_calls
from skillstate.storage.store import Store, StoredEvent


def call_refs(value: Any) -> Iterator[CallRef]:
    """Every CallRef inside an event or value, depth first."""
    if isinstance(value, CallRef):
        yield value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from call_refs(getattr(value, name))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from call_refs(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from call_refs(item)


def _blob_refs(results: list[dict[str, Any]]) -> Iterator[CallRef]:
    for item in results:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("call"), dict):
            yield CallRef.model_validate(item["call"])
        for call in item.get("calls") or []:
            if isinstance(call, dict):
                yield CallRef.model_validate(call)


EventRefs = list[tuple[Event, list[CallRef]]]  # each event with the calls it depended on (`event_call_refs`)


def event_call_refs(store: Store, own: list[StoredEvent]) -> Iterator[tuple[Event, list[CallRef]]]:
    """Each event with every call it depended on, those in its results blob included."""
    decoded: list[Event] = [s.event for s in own]
    blob_hashes = [r for ev in decoded if isinstance(r := getattr(ev, "results", None), str)]
    blobs = store.get_blobs(blob_hashes) if blob_hashes else {}
    for ev in decoded:
        refs = list(call_refs(ev))
        results = getattr(ev, "results", None)
        if isinstance(results, str) and results in blobs:
            refs.extend(_blob_refs(json.loads(blobs[results])))
        yield ev, refs


def unused_calls(store: Store, run_id: str, refs: EventRefs) -> dict[str, dict[str, int]]:
    """Per role, the calls this run sent that none of its events depends on,
    as {"unused": n, "failed": n}. Unused: calls that succeeded, work done
    ahead that the gate made obsolete (`speculative_rollout`) and calls in
    flight when an early reject became certain. Failed: calls that failed in
    a stage never appended (the circuit breaker or a fatal error stopped the
    run there; a resume redoes it), or in work done ahead."""
    used = {ref.request_hash for _, called in refs for ref in called}
    out: dict[str, dict[str, int]] = {}
    for call in store.read_calls(run_id):
        if call.role != EMBEDDER and call.request_hash not in used:  # embeddings are looked up by text
            counts = out.setdefault(call.role, {"unused": 0, "failed": 0})
            counts["unused" if call.error is None else "failed"] += 1
    return out


def failed_call_tokens(store: Store, run_id: str, refs: EventRefs) -> dict[str, dict[str, tuple[int, int]]]:
    """{stage: {role: (prompt tokens, completion tokens)}} of the failed calls
    the events depend on that did get a reply (a truncated or empty optimizer
    reply, say): an event's reference to a failed call holds no usage, the
    call table holds what it cost, and the budget counted it."""
    failed = [(stage_of(ev), ref) for ev, called in refs for ref in called if ref.error is not None]
    if not failed:
        return {}
    tokens: dict[tuple[str, str], tuple[int, int]] = {}  # (hash, error) -> the latest such call's tokens
    query = (select(llm_calls.c.request_hash, llm_calls.c.error, llm_calls.c.prompt_tokens,
                    llm_calls.c.completion_tokens)
             .where(llm_calls.c.run_id == run_id, llm_calls.c.ok.is_(False)).order_by(llm_calls.c.id))
    with store.engine.connect() as conn:
        for row in conn.execute(query):
            tokens[(row[0], row[1])] = (int(row[2] or 0), int(row[3] or 0))
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for stage, ref in failed:
        pt, ct = tokens.get((ref.request_hash, str(ref.error)), (0, 0))
        if pt or ct:
            was = out.setdefault(stage, {}).get(ref.role, (0, 0))
            out[stage][ref.role] = (was[0] + pt, was[1] + ct)
    return out


def failed_calls(refs: EventRefs) -> dict[str, Any]:
    """{"calls", "failed", "by_stage": {stage: {role: {"calls", "failed", "common", "common_count"}}}}."""
    calls: dict[tuple[str, str], int] = defaultdict(int)
    errors: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for ev, called in refs:
        stage = stage_of(ev)
        for ref in called:
            calls[(stage, ref.role)] += 1
            if ref.error is not None:
                errors[(stage, ref.role)][ref.error] += 1
    by_stage: dict[str, dict[str, Any]] = {}
    for key, counter in errors.items():
        stage, role = key
        common, count = counter.most_common(1)[0]
        by_stage.setdefault(stage, {})[role] = {"calls": calls[key], "failed": sum(counter.values()),
                                                "common": common, "common_count": count}
    return {"calls": sum(calls.values()), "failed": sum(sum(c.values()) for c in errors.values()),
            "by_stage": by_stage}
