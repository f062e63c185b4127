"""The journal's index of answered requests (`Store.known_calls`): a run asks
the journal only for requests it holds, and a request another process
recorded after the index was read is still served as resume and verify
will serve it (the first successful call), checked in the commit of the
call this run sent."""

from __future__ import annotations

import pytest
from conftest import small_config

from skillstate.llm.base import ChatRequest, ChatResponse
from skillstate.llm.recording import RecordingClient
from skillstate.reading.audit import verify
from skillstate.storage.store import Store
from skillstate.trainer import Trainer


class Replies:
    """A model that answers every request with the same text (the project's backends' interface)."""

    name = "fixed"

    def __init__(self, text: str):
        self.text = text
        self.sent = 0

    def complete(self, request: ChatRequest) -> ChatResponse:
        self.sent += 1
        return ChatResponse(text=self.text, prompt_tokens=3, completion_tokens=1, finish_reason="stop")


def _request(content: str) -> ChatRequest:
    return ChatRequest.build("openai", "m", [{"role": "user", "content": content}], 0.0, 16)


def test_a_run_asks_the_journal_only_for_requests_it_holds(db_url, monkeypatch):
    asked = []
    real = Store.find_call

    def counted(self, request_hash, **kw):
        row = real(self, request_hash, **kw)
        asked.append(row is not None or kw.get("as_of") is not None)
        return row

    monkeypatch.setattr(Store, "find_call", counted)
    store = Store(db_url)
    first = Trainer(small_config(), store=store, run_id="a").train()
    sent = sum(u["sent"] for u in first.summary["usage"].values())
    assert sent > 0 and asked and all(asked)  # never a lookup that finds nothing: new requests are not asked for
    assert len(asked) < sent  # fewer lookups than calls sent
    asked.clear()
    again = Trainer(small_config(), store=store, run_id="b").train()  # the same requests: all served
    assert sum(u["sent"] for u in again.summary["usage"].values()) == 0 and asked and all(asked)
    assert verify(store, "a").ok and verify(store, "b").ok


@pytest.mark.parametrize("scope", [None, ["a", "b"]])
def test_a_request_recorded_elsewhere_since_the_index_was_read_is_served_as_verify_serves_it(db_url, scope):
    store = Store(db_url)
    index = store.known_calls(scope)
    assert index == set()
    mine = Replies("mine")
    client = RecordingClient(mine, store, run_id="b", role="target", run_ids=scope, index=index)
    request = _request("what is 2 + 2?")
    h = request.hash
    # another process (run a) records the same request after this client read the index
    store.record_call(run_id="a", role="target", request_hash=h, model="m", request=request.to_dict(),
                      response=ChatResponse(text="theirs", finish_reason="stop").to_dict(), prompt_tokens=3,
                      completion_tokens=1, latency_ms=1.0, error=None)
    result = client.complete(request)
    assert mine.sent == 1 and client.sent == 1  # it was sent (the index did not know), and paid
    assert result.text == "theirs"  # but the reply used is the one the journal serves from now on
    assert store.find_call(h, run_ids=scope).response["text"] == "theirs"
    other = _request("what is 3 + 3?")
    assert client.complete(other).text == "mine" and other.hash in index
    again = client.complete(other)  # in the index now: looked up and served, not sent
    assert again.text == "mine" and again.cached and mine.sent == 2


def test_an_index_too_large_to_hold_is_not_kept(db_url, monkeypatch):
    from skillstate.storage import call_journal

    store = Store(db_url)
    for n in range(3):
        request = _request(f"q{n}")
        store.record_call(run_id="a", role="target", request_hash=request.hash, model="m",
                          request=request.to_dict(), response={"text": "x"}, prompt_tokens=0,
                          completion_tokens=0, latency_ms=0.0, error=None)
    monkeypatch.setattr(call_journal, "MAX_INDEXED_CALLS", 2)
    assert store.known_calls(None) is None  # every claim asks the journal then
    monkeypatch.setattr(call_journal, "MAX_INDEXED_CALLS", 3)
    assert len(store.known_calls(None) or ()) == 3
