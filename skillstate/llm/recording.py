"""The recorder: every LLM request and response goes through the call table.

A request already answered (by this run, or by any run when `llm_cache` is
`all`) is served from the table and not sent again; a new one is sent to the
backend and recorded with its usage, latency or error; a failed call counts
toward the circuit breaker (`CallHealth`). In verify mode there is no
backend: each request gets the outcome the recorded event saw, and a request
the log does not hold is a divergence.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

from skillstate.config import redact
from skillstate.errors import ReplayMissError
from skillstate.llm.base import CallFailed, CallResult, ChatRequest, ChatResponse, FatalLLMError, LLMClient
from skillstate.llm.health import CallHealth
from skillstate.log.events import CallRef
from skillstate.storage.call_index import CallIndex
from skillstate.storage.store import Store
from skillstate.util import canonical_json, first_line, sha256_text


def failure_text(err: BaseException, plain: bool = False) -> str:
    """What the journal records of a failed call: the message of a CallFailed (`plain`), else the error's
    type and first line; credentials masked."""
    if plain:
        return redact(str(err))
    return redact(f"{type(err).__name__}: {first_line(err, '')}")


def result_of(h: str, role: str, resp: ChatResponse | None, error: str | None) -> CallResult:
    """What the caller of a sent request gets: its reply, or its recorded failure."""
    if error is not None or resp is None:
        error = error or "no reply"
        return CallResult(CallRef(request_hash=h, role=role, error=error), error=error)
    return CallResult(CallRef(request_hash=h, role=role, prompt_tokens=resp.prompt_tokens,
                              completion_tokens=resp.completion_tokens), text=resp.text,
                      truncated=resp.finish_reason == "length", tool_calls=resp.tool_calls)


class RecentReplies:
    """The replies this process journaled lately, each the first success of
    its request in the client's scope (checked in the commit that recorded
    it), as the journal holds them: a request answered ahead of time (or
    twice in a stage) is served from here without asking the journal, the
    same reply `find_call` would read. Rows are never deleted, so an entry
    never goes stale; the oldest go first past `limit` characters."""

    def __init__(self, limit: int = 16_000_000):
        self.limit = limit
        self._texts: OrderedDict[str, str] = OrderedDict()  # request hash -> the reply's canonical JSON
        self._chars = 0
        self._lock = threading.Lock()

    def put(self, h: str, text: str) -> None:
        if len(text) > self.limit // 4:
            return
        with self._lock:
            old = self._texts.pop(h, None)
            self._chars += len(text) - (len(old) if old is not None else 0)
            self._texts[h] = text
            while self._chars > self.limit:
                self._chars -= len(self._texts.popitem(last=False)[1])

    def get(self, h: str) -> dict | None:
        with self._lock:
            text = self._texts.get(h)
        return json.loads(text) if text is not None else None


class RecordingClient:
    def __init__(self, backend: LLMClient | None, store: Store, *, run_id: str, role: str,
                 run_ids: list[str] | None = None, before=None, budget=None, health: CallHealth | None = None,
                 index: CallIndex | None = None):
        self.backend = backend
        self.store = store
        self.run_id = run_id
        self.role = role
        self.run_ids = run_ids  # None: any run in the database
        self.before = before  # verify: the time the event being re-executed was appended
        self.budget = budget  # skillstate.pricing.Budget: checked before each request sent
        self.health = health or CallHealth(0, 1.0)
        self.sent = 0
        self.served = 0
        self._inflight: dict[str, threading.Event] = {}  # request hash -> set when its sender is done
        self._finished: dict[str, int] = {}  # request hash -> how many of its sends here have been recorded
        self._owners: dict[str, object] = {}  # request hash in flight -> the task holding it (Ray), or None
        self._inflight_lock = threading.Lock()
        # The requests the journal may hold (`CallIndex`): one it cannot hold is sent without asking, and each
        # reply journaled is checked in its commit for an earlier one another process recorded meanwhile, whose
        # reply is used instead. None: ask the journal before every send (and no check).
        self.index = index
        self._replies = RecentReplies()

    def complete(self, request: ChatRequest) -> CallResult:
        """One request, sent at most once at a time: a request already in
        flight on another thread (two episodes that start alike, say) waits
        for that reply and is served it from the table, so every caller sees
        the one reply that resume and verify will serve."""
        if self.backend is None:
            return self._verify(request)
        # the request's canonical JSON, made once: its hash (`request.hash`) and the text journaled
        body = canonical_json(request.to_dict())
        h = sha256_text(body)
        served = self.claim(h)
        if served is not None:
            return served
        try:
            return self._send(request, h, body)
        finally:
            self.release(h)

    def claim(self, h: str, owner: object = None) -> CallResult | None:
        """The recorded reply to request `h`, or None: then the caller is to
        send it and must `release(h)` once its call is recorded (or failed).
        While another caller holds `h`, this one waits for it. A caller with
        the same `owner` as the holder (a retried Ray task whose first
        attempt died holding `h`) takes the claim over instead of waiting."""
        while True:
            finished = self._finished.get(h, 0)
            served = self._serve(h)
            if served is not None:
                return served
            with self._inflight_lock:
                waiting = self._inflight.get(h)
                if waiting is not None and owner is not None and self._owners.get(h) == owner:
                    return None  # taken over: the holder was an earlier attempt of this task
                if waiting is None:
                    self._inflight[h] = threading.Event()
                    self._owners[h] = owner
                    # another thread's send of it was recorded between the check and the claim
                    recorded_since = self._finished.get(h, 0) != finished
            if waiting is None:
                break
            waiting.wait()  # then served; if that call failed, this caller tries itself
        try:
            served = self._serve(h) if recorded_since else None
        except BaseException:
            self.release(h)
            raise
        if served is not None:
            self.release(h)
        return served

    def release(self, h: str, owner: object = None) -> None:
        """End the claim on `h`: callers waiting for it look in the table again. With an `owner`, only
        while that owner holds it (a late outcome of a dead attempt never frees another task's claim)."""
        with self._inflight_lock:
            if owner is not None and self._owners.get(h) != owner:
                return
            self._finished[h] = self._finished.get(h, 0) + 1
            self._owners.pop(h, None)
            done = self._inflight.pop(h, None)
        if done is not None:
            done.set()

    def release_all(self, owners: set[object]) -> None:
        """Release the claims still held by `owners` (tasks that will never record them)."""
        with self._inflight_lock:
            held = [(h, owner) for h, owner in self._owners.items() if owner is not None and owner in owners]
        for h, owner in held:
            self.release(h, owner)

    def _serve(self, h: str) -> CallResult | None:
        response = self._replies.get(h)
        if response is None:
            if self.index is not None and not self.index.may_hold(h):
                return None
            row = self.store.find_call(h, run_ids=self.run_ids)
            if row is None:
                return None
            response = row.response
        self.served += 1
        self.health.served(self.role)
        recorded = ChatResponse.from_dict(response or {})
        return CallResult(self._ref(h, recorded), text=recorded.text, cached=True,
                          truncated=recorded.finish_reason == "length", tool_calls=recorded.tool_calls)

    def _send(self, request: ChatRequest, h: str, body: str) -> CallResult:
        assert self.backend is not None  # complete() verifies when there is no backend
        self.may_send()
        start = time.perf_counter()
        resp: ChatResponse | None = None
        try:
            resp = self.backend.complete(request)
            error = self.unusable(request, resp)
        except FatalLLMError as err:
            self.health.trip(err)
            raise
        except CallFailed as err:
            error = failure_text(err, plain=True)
        except Exception as err:  # a backend's own failure: one failed call, never an aborted stage
            error = failure_text(err)
        return self.record(request.model, h, body, resp, error, (time.perf_counter() - start) * 1000)

    def may_send(self) -> None:
        """Raise when no request may be sent now (the circuit breaker is open, or the budget is spent)."""
        self.health.check()
        if self.budget is not None:
            self.budget.check()

    def record(self, model: str, h: str, body: str, resp: ChatResponse | None, error: str | None,
               latency_ms: float) -> CallResult:
        """Journal one sent request's outcome (sent here, or by a Ray worker) and count it; an error is
        journaled and returned with its credentials masked."""
        error = redact(error) if error is not None else None
        pt, ct = (resp.prompt_tokens, resp.completion_tokens) if resp is not None else (0, 0)
        checked = self.index is not None
        response = canonical_json(resp.to_dict()) if resp is not None else None
        first = self.store.record_call(run_id=self.run_id, role=self.role, request_hash=h, model=model,
                                       request=body, response=response, prompt_tokens=pt, completion_tokens=ct,
                                       latency_ms=latency_ms, error=error, check=checked, scope=self.run_ids)
        if checked and error is None and first is None and response is not None:
            self._replies.put(h, response)  # the first success in scope (or its twin): what the journal serves
        self.sent += 1
        if self.budget is not None and resp is not None:
            self.budget.add(model, pt, ct)
        self.health.record(self.role, error)
        if self.index is not None and (error is None or first is not None):
            self.index.add(h)
        if first is not None:  # another process journaled this request first (this call was still paid, or it
            served = ChatResponse.from_dict(first.response or {})  # failed): that reply is what resume and verify serve
            return CallResult(self._ref(h, served), text=served.text, truncated=served.finish_reason == "length",
                              tool_calls=served.tool_calls)
        return result_of(h, self.role, resp, error)

    def sibling(self, health: CallHealth) -> RecordingClient:
        """A client for work done ahead of time: the same backend, journal,
        budget and in-flight requests (so a request is still sent at most
        once at a time), with its own circuit-breaker counts."""
        other = RecordingClient(self.backend, self.store, run_id=self.run_id, role=self.role, run_ids=self.run_ids,
                                before=self.before, budget=self.budget, health=health, index=self.index)
        other._inflight, other._finished, other._inflight_lock = self._inflight, self._finished, self._inflight_lock
        other._owners, other._replies = self._owners, self._replies
        return other

    def unusable(self, request: ChatRequest, resp: ChatResponse) -> str | None:
        """Why a well-formed reply is still a failed call, if it is. An empty
        answer from the target is an answer; the optimizer must say something
        and must not be cut off."""
        if self.role != "optimizer":
            return None
        if resp.finish_reason == "length":
            return (f"reply truncated at max_tokens={request.max_tokens} (finish_reason length); "
                    f"raise {self.role}.max_tokens")
        if not resp.text.strip():
            return "empty reply"
        return None

    def _verify(self, request: ChatRequest) -> CallResult:
        """The outcome the recorded event saw, from the call table alone."""
        h = request.hash
        row = self.store.find_call(h, run_ids=self.run_ids, as_of=self.before)
        if row is None:
            raise ReplayMissError(f"the log holds no response for {self.role} request {h[:12]}")
        self.served += 1
        if row.error is not None:
            return CallResult(CallRef(request_hash=h, role=self.role, error=row.error), error=row.error, cached=True)
        resp = ChatResponse.from_dict(row.response or {})
        return CallResult(self._ref(h, resp), text=resp.text, cached=True, truncated=resp.finish_reason == "length",
                          tool_calls=resp.tool_calls)

    def _ref(self, h: str, resp: ChatResponse) -> CallRef:
        return CallRef(request_hash=h, role=self.role, prompt_tokens=resp.prompt_tokens,
                       completion_tokens=resp.completion_tokens)
