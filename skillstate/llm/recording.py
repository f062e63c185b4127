"""The recorder: every LLM request and response goes through the call table.

A request already answered (by this run, or by any run when `llm_cache` is
`all`) is served from the table and not sent again; a new one is sent to the
backend and recorded with its usage, latency or error. In verify mode there
is no backend: a request the log does not hold is a divergence.
"""

from __future__ import annotations

import time

from skillstate.config import redact
from skillstate.errors import ReplayMissError
from skillstate.events import CallRef
from skillstate.llm.base import CallResult, ChatRequest, ChatResponse, FatalLLMError, LLMClient
from skillstate.store import Store


class RecordingClient:
    def __init__(self, backend: LLMClient | None, store: Store, *, run_id: str, role: str,
                 run_ids: list[str] | None = None, before=None, budget=None):
        self.backend = backend
        self.store = store
        self.run_id = run_id
        self.role = role
        self.run_ids = run_ids  # None: any run in the database
        self.before = before  # verify: only calls recorded before the run's last event
        self.budget = budget  # skillstate.pricing.Budget: checked before each request sent
        self.sent = 0
        self.served = 0

    def complete(self, request: ChatRequest) -> CallResult:
        h = request.hash
        verify = self.backend is None
        row = self.store.find_call(h, run_ids=self.run_ids, include_errors=verify, before=self.before)
        if row is not None:
            self.served += 1
            if row.error is not None:
                return CallResult(CallRef(request_hash=h, role=self.role, error=row.error), error=row.error,
                                  cached=True)
            resp = ChatResponse.from_dict(row.response or {})
            return CallResult(self._ref(h, resp), text=resp.text, cached=True)
        if verify:
            raise ReplayMissError(f"the log holds no response for {self.role} request {h[:12]}")
        if self.budget is not None:
            self.budget.check()
        start = time.perf_counter()
        try:
            resp = self.backend.complete(request)
        except FatalLLMError:
            raise
        except Exception as err:  # one failed call never aborts a stage
            latency = (time.perf_counter() - start) * 1000
            message = redact(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}")
            self.store.record_call(run_id=self.run_id, role=self.role, request_hash=h, model=request.model,
                                   request=request.to_dict(), response=None, prompt_tokens=0, completion_tokens=0,
                                   latency_ms=latency, error=message)
            self.sent += 1
            return CallResult(CallRef(request_hash=h, role=self.role, error=message), error=message)
        latency = (time.perf_counter() - start) * 1000
        self.store.record_call(run_id=self.run_id, role=self.role, request_hash=h, model=request.model,
                               request=request.to_dict(), response=resp.to_dict(), prompt_tokens=resp.prompt_tokens,
                               completion_tokens=resp.completion_tokens, latency_ms=latency, error=None)
        self.sent += 1
        if self.budget is not None:
            self.budget.add(request.model, resp.prompt_tokens, resp.completion_tokens)
        return CallResult(self._ref(h, resp), text=resp.text)

    def _ref(self, h: str, resp: ChatResponse) -> CallRef:
        return CallRef(request_hash=h, role=self.role, prompt_tokens=resp.prompt_tokens,
                       completion_tokens=resp.completion_tokens)
