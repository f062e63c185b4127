"""The recorder: every LLM request and response goes through the call table.

A request already answered (by this run, or by any run when `llm_cache` is
`all`) is served from the table and not sent again; a new one is sent to the
backend and recorded with its usage, latency or error; a failed call counts
toward the circuit breaker (`CallHealth`). In verify mode there is no
backend: each request gets the outcome the recorded event saw, and a request
the log does not hold is a divergence.
"""

from __future__ import annotations

import threading
import time
from typing import cast

from skillstate.config import redact
from skillstate.errors import ReplayMissError
from skillstate.events import CallRef
from skillstate.llm.base import CallFailed, CallResult, ChatRequest, ChatResponse, FatalLLMError, LLMClient
from skillstate.llm.health import CallHealth
from skillstate.store import Store
from skillstate.util import canonical_json, sha256_text


class RecordingClient:
    def __init__(self, backend: LLMClient | None, store: Store, *, run_id: str, role: str,
                 run_ids: list[str] | None = None, before=None, budget=None, health: CallHealth | None = None):
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
        self._inflight_lock = threading.Lock()

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
        while True:
            finished = self._finished.get(h, 0)
            served = self._serve(h)
            if served is not None:
                return served
            with self._inflight_lock:
                waiting = self._inflight.get(h)
                if waiting is None:
                    mine = self._inflight[h] = threading.Event()
                    # another thread's send of it was recorded between the check and the claim
                    recorded_since = self._finished.get(h, 0) != finished
            if waiting is None:
                break
            waiting.wait()  # then served; if that call failed, this caller tries itself
        try:
            served = self._serve(h) if recorded_since else None
            return served if served is not None else self._send(request, h, body)
        finally:
            with self._inflight_lock:
                self._finished[h] = self._finished.get(h, 0) + 1
                del self._inflight[h]
            mine.set()

    def _serve(self, h: str) -> CallResult | None:
        row = self.store.find_call(h, run_ids=self.run_ids)
        if row is None:
            return None
        self.served += 1
        self.health.served(self.role)
        recorded = ChatResponse.from_dict(row.response or {})
        return CallResult(self._ref(h, recorded), text=recorded.text, cached=True,
                          truncated=recorded.finish_reason == "length", tool_calls=recorded.tool_calls)

    def _send(self, request: ChatRequest, h: str, body: str) -> CallResult:
        assert self.backend is not None  # complete() verifies when there is no backend
        self.health.check()
        if self.budget is not None:
            self.budget.check()
        start = time.perf_counter()
        resp: ChatResponse | None = None
        try:
            resp = self.backend.complete(request)
            error = self.unusable(request, resp)
        except FatalLLMError as err:
            self.health.trip(err)
            raise
        except CallFailed as err:
            error = redact(str(err))
        except Exception as err:  # a backend's own failure: one failed call, never an aborted stage
            error = redact(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
        latency = (time.perf_counter() - start) * 1000
        pt, ct = (resp.prompt_tokens, resp.completion_tokens) if resp is not None else (0, 0)
        self.store.record_call(run_id=self.run_id, role=self.role, request_hash=h, model=request.model,
                               request=body, response=resp.to_dict() if resp is not None else None,
                               prompt_tokens=pt, completion_tokens=ct, latency_ms=latency, error=error)
        self.sent += 1
        if self.budget is not None and resp is not None:
            self.budget.add(request.model, pt, ct)
        self.health.record(self.role, error)
        if error is not None:
            return CallResult(CallRef(request_hash=h, role=self.role, error=error), error=error)
        reply = cast(ChatResponse, resp)  # error is None only after a reply: every failure above sets it
        return CallResult(self._ref(h, reply), text=reply.text, truncated=reply.finish_reason == "length",
                          tool_calls=reply.tool_calls)

    def sibling(self, health: CallHealth) -> RecordingClient:
        """A client for work done ahead of time: the same backend, journal,
        budget and in-flight requests (so a request is still sent at most
        once at a time), with its own circuit-breaker counts."""
        other = RecordingClient(self.backend, self.store, run_id=self.run_id, role=self.role, run_ids=self.run_ids,
                                before=self.before, budget=self.budget, health=health)
        other._inflight, other._finished, other._inflight_lock = self._inflight, self._finished, self._inflight_lock
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
