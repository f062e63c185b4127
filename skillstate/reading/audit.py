"""Checking a log: the hash chain and invariants (audit), and re-execution
against the recorded LLM responses (verify).

What audit detects depends on what it is given:
- alone, any change to a stored event, a gap, a reordering, an unknown type
  or payload, a missing or altered blob, a fold error, a changed fork prefix;
  but not a log whose tail was cut, nor one whose whole chain was re-hashed
  by someone who rewrote events (the hashes are unkeyed);
- with $SKILLSTATE_AUDIT_KEY, every event must carry the HMAC of its hash
  under that key, so a re-hashed chain fails without the key;
- with a recorded head (`skillstate head`, kept elsewhere), the chain must
  still contain that event, so a cut tail or a rewritten past fails too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skillstate.engine import review
from skillstate.engine.runner import build_context, config_of, drive, lineage_events, load_run
from skillstate.errors import EnvFailure, ReplayMissError, UserError
from skillstate.log.event_codec import encode
from skillstate.log.events import Event, RunForked, StopConditionMet
from skillstate.log.events_review import ReviewDecided
from skillstate.log.reducer import RunState, reduce
from skillstate.storage.blob_walk import blob_damage
from skillstate.storage.chain import check_chain, label
from skillstate.storage.store import GENESIS, Store, StoredEvent
from skillstate.util import canonical_json


@dataclass
class AuditReport:
    run_id: str
    events: int = 0
    problems: list[str] = field(default_factory=list)
    keyed: bool = False  # every event's signature was checked
    head_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Head:
    """The last event of a run: what a user records elsewhere to detect a
    cut or rewritten log later (`audit --head`)."""

    run_id: str
    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"


def head(store: Store, run_id: str | None) -> Head:
    row = store.require_run(run_id)
    own = store.read_events(row.run_id)
    last = own[-1] if own else None
    return Head(row.run_id, last.seq if last else 0, last.hash if last else GENESIS)


def parse_head(text: str) -> tuple[int | None, str]:
    """`SEQ:HASH` or a bare HASH, as `skillstate head` prints it."""
    seq, sep, h = text.strip().rpartition(":")
    h = h.lower()
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h) or (sep and not seq.isdigit()):
        raise UserError(f"--head takes SEQ:HASH as `skillstate head` prints it (a 64-digit hex hash), got {text!r}")
    return (int(seq) if sep else None), h


def audit(store: Store, run_id: str | None, *, expect_head: str | None = None) -> AuditReport:
    """Check a run's log; with `expect_head` (SEQ:HASH) the log must still hold that event."""
    expected = parse_head(expect_head) if expect_head is not None else None
    row = store.require_run(run_id)
    own = store.read_events(row.run_id)
    report = AuditReport(row.run_id, len(own), keyed=store.audit_key is not None)
    if not own:
        report.problems.append(f"run {row.run_id} has no events")
        return report
    first_prev, prefix = GENESIS, []
    if row.parent_run_id is not None:
        parent = audit(store, row.parent_run_id)
        if not parent.ok:
            report.problems.append(f"fork parent: {parent.problems[0]}")
            return report
        try:
            first = own[0].event
        except Exception:
            first = None
        if not isinstance(first, RunForked):
            report.problems.append(f"{label(own[0])}: a fork must start with RunForked")
            return report
        prefix = lineage_events(store, row.parent_run_id)[: first.parent_event_count]
        if len(prefix) != first.parent_event_count or prefix[-1].hash != first.parent_event_hash:
            report.problems.append(f"{label(own[0])}: the parent's prefix changed since the fork")
            return report
        first_prev = first.parent_event_hash
    decoded, problem = check_chain(own, first_prev, key=store.audit_key, require_mac=store.audit_key is not None)
    if problem:
        report.problems.append(problem)
        return report
    if expected is not None:
        seq, h = expected
        at = next((s for s in own if s.hash == h), None)
        if at is None or (seq is not None and at.seq != seq):
            report.problems.append(f"run {row.run_id}: the recorded head {seq if seq is not None else '?'}:{h[:12]} "
                                   "is not in the log (its tail was cut or its past rewritten)")
            return report
        report.head_checked = True
    problem = blob_damage(store, own, decoded)
    if problem:
        report.problems.append(problem)
        return report
    state = RunState()
    for s in prefix:
        state = reduce(state, s.event)
    for s, ev in zip(own, decoded, strict=False):
        try:
            state = reduce(state, ev)
        except Exception as err:
            report.problems.append(f"{label(s)}: the fold fails: {err}")
            return report
    return report


# --- verify ----------------------------------------------------------------


class EndOfLog(Exception):
    """Verification reached the end of an incomplete run's log."""


class Divergence(Exception):
    def __init__(self, seq: int, message: str):
        super().__init__(message)
        self.seq = seq


def _first_difference(want: dict, got: dict, path: str = "") -> str:
    for key in sorted(set(want) | set(got)):
        a, b = want.get(key), got.get(key)
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                return _first_difference(a, b, f"{path}{key}.")
            shown_a, shown_b = canonical_json(a)[:80], canonical_json(b)[:80]
            return f"{path}{key}: log has {shown_a}, re-execution gives {shown_b}"
    return "payloads differ"


class VerifyLog:
    """A log that appends nothing and compares each event with the recorded one."""

    def __init__(self, expected: list[StoredEvent]):
        self.expected = expected
        self.pos = 0

    @property
    def exhausted(self) -> bool:
        return self.pos >= len(self.expected)

    def append(self, events: list[Event], blobs: dict[str, str]) -> list[StoredEvent]:
        for i, ev in enumerate(events):
            if self.exhausted:  # a crash never leaves part of a stage's events: they are appended at once
                last = self.expected[-1].seq if self.expected else 1
                raise Divergence(last + 1, f"the log ends inside a stage: re-execution also produces {ev.type} "
                                           f"after {events[i - 1].type}")
            exp = self.expected[self.pos]
            want, got = encode(exp.event), encode(ev)
            if exp.type != ev.type:
                raise Divergence(exp.seq, f"log has {exp.type}, re-execution gives {ev.type}")
            if canonical_json(want) != canonical_json(got):
                raise Divergence(exp.seq, f"{exp.type}: {_first_difference(want, got)}")
            self.pos += 1
        return []


@dataclass
class VerifyReport:
    run_id: str
    checked: int
    total: int
    divergence: str | None = None
    seq: int | None = None
    note: str | None = None  # what verifying this run did not do (a policy run's training is not re-executed)

    @property
    def ok(self) -> bool:
        return self.divergence is None


def verify(store: Store, run_id: str | None) -> VerifyReport:
    """Re-execute a run against its recorded LLM responses and compare events."""
    loaded = load_run(store, run_id, check_blobs=True)  # nothing is re-executed on top of a damaged blob
    own = loaded.own
    report = VerifyReport(loaded.run_id, 0, len(own))
    if not own:
        report.divergence = "the run has no events"
        return report
    if loaded.state.kind == "policy":
        from skillstate.reading.policy_verify import policy_divergence

        report.checked = len(own)
        report.note = ("training is not re-executed: each checkpoint's hash was checked, and each evolution's "
                       "teacher call is in the journal, its bank and its decision follow from what it recorded")
        found = policy_divergence(store, loaded)
        if found is not None:
            report.divergence, report.seq = found
        return report
    inherited = len(loaded.lineage) - len(own)
    state = RunState()
    for s in loaded.lineage[: inherited + 1]:  # the parent's prefix and the run's own first event are inputs
        state = reduce(state, s.event)
    log = VerifyLog(own[1:])
    ctx = build_context(store, loaded.run_id, state, config_of(state), log, verify_until=own[-1].created_at)

    def before_stage(_name: str) -> None:
        if log.exhausted:  # an incomplete run: everything it has was checked
            raise EndOfLog
        for client in ctx.clients.values():  # the calls as they stood when the stage's events were appended
            client.before = log.expected[log.pos].created_at
        if hasattr(ctx.embedder, "before"):  # journaled embeddings too
            ctx.embedder.before = log.expected[log.pos].created_at

    def recorded_stop(_state: RunState, name: str) -> Event | None:
        """A stop is an input, like the run's first event: re-execution takes the recorded one; and so is a
        review's decision, where the step awaits it."""
        nxt = None if log.exhausted else log.expected[log.pos].event
        if name == review.AWAIT and isinstance(nxt, ReviewDecided):
            return nxt
        return nxt if isinstance(nxt, StopConditionMet) else None

    try:
        drive(ctx, state, before_stage, stops=recorded_stop, halt=False)
        if not log.exhausted:
            nxt = log.expected[log.pos]
            report.divergence, report.seq = f"log has {nxt.type} after the run completes", nxt.seq
    except EndOfLog:
        pass
    except Divergence as div:
        report.divergence, report.seq = str(div), div.seq
    except ReplayMissError as err:
        if not log.exhausted:  # an incomplete run ends where its recorded calls end
            nxt = log.expected[log.pos]
            report.divergence, report.seq = f"{nxt.type}: {err}", nxt.seq
    except EnvFailure as err:  # re-executing needs the world, and it failed: not verified
        at = log.expected[min(log.pos, len(log.expected) - 1)].seq if log.expected else 1
        report.divergence, report.seq = str(err), at
    finally:
        ctx.close()
    report.checked = 1 + log.pos
    return report
