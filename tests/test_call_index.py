"""The index of answered requests (`CallIndex`): a run asks the journal only
for requests its scope may hold, and a request another process journaled
after the index was read is still answered as resume and verify will answer
it (the first successful call), checked in the commit of the call this run
sent. On SQLite and on PostgreSQL (skipped without $SKILLSTATE_TEST_PG_URL)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from conftest import Databases, small_config
from sqlalchemy import event, insert, text

from skillstate.llm.base import ChatRequest, ChatResponse
from skillstate.llm.recording import RecentReplies, RecordingClient
from skillstate.reading.audit import verify
from skillstate.storage import call_index
from skillstate.storage.call_index import CallIndex, hash_key
from skillstate.storage.call_journal import SUPERSEDED
from skillstate.storage.schema import llm_calls
from skillstate.storage.store import Store
from skillstate.trainer import Trainer
from skillstate.util import canonical_json


class Replies:
    """A model that answers every request with the same text (the project's backends' interface)."""

    name = "fixed"

    def __init__(self, text: str, fail: bool = False):
        self.text, self.fail = text, fail
        self.sent = 0

    def complete(self, request: ChatRequest) -> ChatResponse:
        self.sent += 1
        if self.fail:
            raise RuntimeError("the server is down")
        return ChatResponse(text=self.text, prompt_tokens=3, completion_tokens=1, finish_reason="stop")


def _request(content: str) -> ChatRequest:
    return ChatRequest.build("openai", "m", [{"role": "user", "content": content}], 0.0, 16)


def _journal(store: Store, run_id: str, request: ChatRequest, text: str | None, error: str | None = None) -> None:
    """A call of `request` journaled by another process (run `run_id`)."""
    store.record_call(run_id=run_id, role="target", request_hash=request.hash, model="m", request=request.to_dict(),
                      response=None if text is None else ChatResponse(text=text, finish_reason="stop").to_dict(),
                      prompt_tokens=3, completion_tokens=1, latency_ms=1.0, error=error)


@pytest.fixture(params=["sqlite", "postgresql"])
def urls(request, tmp_path):
    d = Databases(tmp_path, request.param)
    yield d
    d.drop()


def test_a_run_asks_the_journal_only_for_requests_it_may_hold(urls, monkeypatch):
    asked = []
    real = Store.find_call

    def counted(self, request_hash, **kw):
        row = real(self, request_hash, **kw)
        asked.append(row is not None or kw.get("as_of") is not None)
        return row

    monkeypatch.setattr(Store, "find_call", counted)
    store = Store(urls.new())
    first = Trainer(small_config(), store=store, run_id="a").train()
    sent = sum(u["sent"] for u in first.summary["usage"].values())
    used = sum(u["calls"] for u in first.summary["usage"].values())
    # requests answered ahead of time were served from the replies the run journaled itself (`RecentReplies`),
    # and new requests were never asked for: no lookup at all
    assert 0 < sent < used and asked == []
    asked.clear()
    again = Trainer(small_config(llm_cache="all"), store=store, run_id="b").train()  # the same requests: all served
    assert sum(u["sent"] for u in again.summary["usage"].values()) == 0 and asked and all(asked)
    assert verify(store, "a").ok and verify(store, "b").ok
    store.close()


@pytest.mark.parametrize("scope", [None, ["a", "b"]])
def test_a_request_journaled_elsewhere_after_the_index_was_read_gets_the_first_reply(urls, scope):
    store = Store(urls.new())
    index = CallIndex(store, scope)
    assert len(index) == 0
    mine = Replies("mine")
    client = RecordingClient(mine, store, run_id="b", role="target", run_ids=scope, index=index)
    request = _request("what is 2 + 2?")
    _journal(store, "a", request, "theirs")  # another process, after this client read the index
    result = client.complete(request)
    assert mine.sent == 1 and client.sent == 1  # sent, since the index did not know it, and paid
    assert not result.cached  # paid: the meter counts it as sent
    assert result.text == "theirs"  # but the reply used is the one the journal serves from now on
    assert store.find_call(request.hash, run_ids=scope).response["text"] == "theirs"
    repeat = client.complete(request)  # served the first reply, never this client's own
    assert repeat.text == "theirs" and repeat.cached and mine.sent == 1
    other = _request("what is 3 + 3?")
    assert client.complete(other).text == "mine" and index.may_hold(other.hash)
    again = client.complete(other)  # served, not sent
    assert again.text == "mine" and again.cached and mine.sent == 2
    store.close()


def test_a_reply_this_client_journaled_is_served_without_asking_the_journal(urls, monkeypatch):
    store = Store(urls.new())
    client = RecordingClient(Replies("mine"), store, run_id="a", role="target", index=CallIndex(store, None))
    ahead = client.sibling(client.health)  # work done ahead: the same journal and replies
    request = _request("q")
    assert ahead.complete(request).text == "mine"
    row = store.find_call(request.hash)
    monkeypatch.setattr(Store, "find_call", lambda *a, **k: pytest.fail("asked the journal"))
    served = client.complete(request)
    assert served.cached and served.text == "mine" and client.backend.sent == 1
    assert (served.ref.prompt_tokens, served.ref.completion_tokens) == (row.prompt_tokens, row.completion_tokens)
    store.close()


def test_the_recent_replies_keep_the_newest_within_their_size():
    replies = RecentReplies(limit=60)
    for n in range(5):
        replies.put(f"h{n}", canonical_json({"text": "x" * n}))  # 11 to 15 characters: 65 in all
    assert replies.get("h0") is None  # the oldest went
    assert [replies.get(f"h{n}") for n in range(1, 5)] == [{"text": "x" * n} for n in range(1, 5)]
    replies.put("big", canonical_json({"text": "y" * 20}))  # over a quarter of the limit: not kept
    assert replies.get("big") is None and replies.get("h4") == {"text": "xxxx"}


def test_a_call_outside_the_scope_is_neither_indexed_nor_served(urls):
    store = Store(urls.new())
    request = _request("q")
    _journal(store, "elsewhere", request, "theirs")
    index = CallIndex(store, ["a"])
    assert not index.may_hold(request.hash)
    mine = Replies("mine")
    client = RecordingClient(mine, store, run_id="a", role="target", run_ids=["a"], index=index)
    assert client.complete(request).text == "mine" and mine.sent == 1  # the other run's reply is not this scope's
    assert CallIndex(store, None).may_hold(request.hash)  # with llm_cache all, it is
    store.close()


def test_failed_calls_are_not_indexed_and_a_failed_send_keeps_its_error(urls):
    store = Store(urls.new())
    request = _request("q")
    _journal(store, "a", request, None, error="timeout")
    index = CallIndex(store, ["a"])
    assert not index.may_hold(request.hash)
    down = RecordingClient(Replies("x", fail=True), store, run_id="a", role="target", run_ids=["a"], index=index)
    failed = down.complete(request)
    assert failed.error and "server is down" in failed.error and not index.may_hold(request.hash)
    up = Replies("ok")
    client = RecordingClient(up, store, run_id="a", role="target", run_ids=["a"], index=index)
    assert client.complete(request).text == "ok" and up.sent == 1  # retried: a failure is never served
    assert client.complete(request).cached and up.sent == 1
    store.close()


def test_siblings_share_the_index(urls):
    store = Store(urls.new())
    index = CallIndex(store, ["a"])
    backend = Replies("r")
    client = RecordingClient(backend, store, run_id="a", role="target", run_ids=["a"], index=index)
    ahead = client.sibling(client.health)
    request = _request("q")
    assert ahead.complete(request).text == "r"
    assert client.complete(request).cached and backend.sent == 1
    store.close()


def test_refresh_reads_what_other_processes_journaled(urls, monkeypatch):
    monkeypatch.setattr(call_index, "_MERGE_AT", 2)  # merge into the sorted array on the way
    url = urls.new()
    store, other = Store(url), Store(url)
    index = CallIndex(store, None)
    requests = [_request(f"q{n}") for n in range(5)]
    for r in requests:
        _journal(other, "b", r, "x")
    assert not any(index.may_hold(r.hash) for r in requests)
    index.refresh()
    assert all(index.may_hold(r.hash) for r in requests) and len(index) == 5
    mine = _request("mine")
    index.add(mine.hash)
    index.refresh()
    assert index.may_hold(mine.hash) and all(index.may_hold(r.hash) for r in requests)
    store.close()
    other.close()


def _answered(url: str, n: int) -> Store:
    """A store whose journal holds `n` answered requests, q0 to q{n-1}."""
    store = Store(url)
    for k in range(n):
        _journal(store, "a", _request(f"q{k}"), "x")
    return store


def test_an_index_too_large_to_hold_asks_the_journal_for_everything(urls, monkeypatch):
    store = _answered(urls.new(), 3)
    monkeypatch.setattr(call_index, "MAX_INDEXED_CALLS", 2)
    index = CallIndex(store, None)
    assert not index.usable and index.may_hold(_request("never sent").hash)
    monkeypatch.setattr(call_index, "MAX_INDEXED_CALLS", 3)
    assert len(CallIndex(store, None)) == 3
    store.close()


def test_two_processes_sending_the_same_request_at_once_both_use_the_first_reply(urls):
    """Two stores (two connection pools, as two processes have) journal the
    same requests at the same moment, each with an index that lacks them."""
    url = urls.new()
    _race([Store(url), Store(url)])


def _race(stores: list[Store]) -> None:
    clients = [RecordingClient(Replies(f"reply {n}"), s, run_id=f"r{n}", role="target", run_ids=None,
                               index=CallIndex(s, None)) for n, s in enumerate(stores)]
    requests = [_request(f"race {n}") for n in range(30)]
    results: dict[int, list[str]] = {0: [], 1: []}
    start = threading.Barrier(2)

    def send(n: int) -> None:
        start.wait()
        for r in requests:
            results[n].append(clients[n].complete(r).text)

    threads = [threading.Thread(target=send, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    served = [stores[0].find_call(r.hash).response["text"] for r in requests]
    assert results[0] == served and results[1] == served  # each used what resume and verify will serve
    sent = [c.backend.sent for c in clients]
    assert [[c.complete(r).text for r in requests] for c in clients] == [served, served]  # and again, unsent
    assert [c.backend.sent for c in clients] == sent
    for s in stores:
        s.close()


def _pending(request: ChatRequest, run_id: str, text: str | None, error: str | None = None):
    """A checked call row of `request` by run `run_id`, as `record_call` queues it (any run in scope)."""
    from skillstate.storage.call_journal import _PendingCall

    response = None if text is None else canonical_json(ChatResponse(text=text, finish_reason="stop").to_dict())
    return _PendingCall(dict(run_id=run_id, role="target", request_hash=request.hash, model="m",
                             request=canonical_json(request.to_dict()), response=response, prompt_tokens=3,
                             completion_tokens=1, latency_ms=1.0, error=error, ok=error is None,
                             created_at=dt.datetime.now(dt.timezone.utc)), check=True, scope=None)


def test_two_clients_of_one_store_recording_a_request_in_one_commit_both_use_the_earlier_row(urls):
    # (two runs in one process, or two roles sending the same request): the rows are written in batch order,
    # so the later one's reply is the earlier one's, for its caller now and for every serve after it
    store = Store(urls.new())
    request = _request("same")
    a, b, twin, apart = (_pending(request, run_id, text) for run_id, text in (("a", "A"), ("b", "B"), ("c", "A"),
                                                                                ("e", "E")))
    failed = _pending(request, "d", None, "down")
    apart.scope = ["e"]  # its scope holds none of the others
    store._write_calls([a, b, twin, failed, apart], [a])
    assert a.first is None and twin.first is None and apart.first is None  # the first, its twin, out of scope
    assert b.first is not None and b.first.response["text"] == "A"
    assert failed.first is not None and failed.first.response["text"] == "A"
    assert store.find_call(request.hash).response["text"] == "A"
    assert [c.error for c in store.read_calls("d")][0].startswith(SUPERSEDED)
    store.close()


def test_a_batch_interrupted_before_its_commit_marks_a_failure_superseded_only_by_what_is_written(urls):
    # the success that superseded a failure in the same batch was the interrupted caller's own row, which is not
    # written again: the failure, written by its own caller, keeps its plain error (verify reads it as failed)
    store = Store(urls.new())
    request = _request("q")
    mine, failed = _pending(request, "a", "A"), _pending(request, "b", None, "down")
    crashes = [KeyboardInterrupt()]

    def insert_crashes(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("INSERT") and crashes:
            raise crashes.pop()

    event.listen(store.engine, "before_cursor_execute", insert_crashes)
    with pytest.raises(KeyboardInterrupt):
        store._write_calls([mine, failed], [mine])
    assert failed.row["error"].startswith(SUPERSEDED)  # (as that attempt marked it)
    assert store._calls_pending == [failed]  # queued again for its own caller, who writes it next
    store._calls_pending, store._calls_writing = [], True
    store._write_calls([failed], [failed])
    assert failed.first is None and [c.error for c in store.read_calls("b")] == ["down"]
    assert store.find_call(request.hash, as_of=dt.datetime.now(dt.timezone.utc)).error == "down"
    store.close()


def test_a_failed_send_of_a_request_answered_meanwhile_gets_that_reply_and_records_no_error(urls):
    """With an error row after the success, verify of any run served that success would say it failed."""
    url = urls.new()
    theirs, mine, later = Store(url), Store(url), Store(url)
    down = RecordingClient(Replies("b", fail=True), mine, run_id="B", role="target", index=CallIndex(mine, None))
    q = _request("q")
    assert RecordingClient(Replies("a"), theirs, run_id="A", role="target").complete(q).text == "a"
    result = down.complete(q)  # the index was read before A answered: sent, and the send failed
    assert result.error is None and result.text == "a" and not result.cached and down.sent == 1
    (failed,) = mine.read_calls("B")  # recorded for its cost, marked so that verify skips it
    assert failed.error.startswith(SUPERSEDED) and "server is down" in failed.error
    served = RecordingClient(Replies("x"), later, run_id="X", role="target").complete(q)
    assert served.cached and served.text == "a"
    event_time = dt.datetime.now(dt.timezone.utc)
    verifier = RecordingClient(None, later, run_id="X", role="target", before=event_time)
    assert verifier.complete(q).text == "a"
    for s in (theirs, mine, later):
        s.close()


def test_a_send_that_waits_for_another_writers_commit_sees_its_row(urls):
    """Another process holds its transaction open with the same request's row in it (on PostgreSQL under
    that request's lock, on SQLite the write lock); this run's commit waits, then uses that row's reply."""
    url = urls.new()
    store, other = Store(url), Store(url)
    client = RecordingClient(Replies("mine"), store, run_id="B", role="target", index=CallIndex(store, None))
    q = _request("q")
    row = dict(run_id="A", role="target", request_hash=q.hash, model="m", request="{}",
               response=canonical_json(ChatResponse(text="theirs", finish_reason="stop").to_dict()),
               prompt_tokens=3, completion_tokens=1, latency_ms=1.0, error=None, ok=True,
               created_at=dt.datetime.now(dt.timezone.utc))
    got: list[str] = []
    with other.engine.connect() as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": hash_key(q.hash) - (1 << 63)})
        conn.execute(insert(llm_calls), [row])
        sender = threading.Thread(target=lambda: got.append(client.complete(q).text))
        sender.start()
        sender.join(1.0)
        assert sender.is_alive()  # waiting for this transaction
    sender.join(30)
    assert got == ["theirs"] and store.find_call(q.hash).response["text"] == "theirs"
    store.close()
    other.close()


def test_a_server_defaulting_to_repeatable_read_still_serializes_writers(tmp_path):
    d = Databases(tmp_path, "postgresql")
    try:
        url = d.new().replace("search_path%3D",
                              "default_transaction_isolation%3Drepeatable%5C%20read%20-csearch_path%3D")
        stores = [Store(url), Store(url)]
        with stores[0].engine.connect() as conn:
            assert conn.execute(text("SHOW default_transaction_isolation")).scalar() == "repeatable read"
        _race(stores)
    finally:
        d.drop()


def test_a_refresh_reading_its_late_window_again_keeps_an_index_near_its_cap(urls, monkeypatch):
    store = _answered(urls.new(), 4)
    monkeypatch.setattr(call_index, "MAX_INDEXED_CALLS", 5)
    index = CallIndex(store, None)
    index.refresh()  # reads the same 4 rows again (the late window): nothing new
    assert index.usable and len(index) == 4
    _journal(store, "a", _request("q4"), "x")
    index.refresh()
    assert index.usable and len(index) == 5
    _journal(store, "a", _request("q5"), "x")
    index.refresh()
    assert not index.usable
    store.close()


def test_calls_recorded_together_are_written_in_one_commit_and_return_once_all_are(urls):
    store = Store(urls.new())
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    requests = [_request(f"q{n}") for n in range(3)]
    store.record_calls([dict(run_id="r", role="embedder", request_hash=r.hash, model="m", request=r.to_dict(),
                             response={"embedding": [float(n)]}, prompt_tokens=n, completion_tokens=0,
                             latency_ms=1.0, error=None) for n, r in enumerate(requests)])
    assert len(commits) == 1 and [c.request_hash for c in store.read_calls("r")] == [r.hash for r in requests]
    assert [store.find_call(r.hash).response for r in requests] == [{"embedding": [float(n)]} for n in range(3)]
    _journal(store, "t", requests[0], None, error="down")  # a later failure: find_calls, like find_call, skips it
    everywhere = store.find_calls([r.hash for r in requests] + [_request("none").hash])
    assert {h: c.response for h, c in everywhere.items()} == {r.hash: {"embedding": [float(n)]}
                                                              for n, r in enumerate(requests)}
    assert store.find_calls([r.hash for r in requests], run_ids=["t", "u"]) == {}  # none succeeded in those runs
    crashes = [RuntimeError("disk full")]

    def insert_fails(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("INSERT") and crashes:
            raise crashes.pop()

    event.listen(store.engine, "before_cursor_execute", insert_fails)
    with pytest.raises(Exception, match="disk full"):  # nothing of the batch is written, and the caller knows it
        store.record_calls([dict(run_id="s", role="embedder", request_hash=_request("x").hash, model="m",
                                 request=_request("x").to_dict(), response={"embedding": [1.0]}, prompt_tokens=0,
                                 completion_tokens=0, latency_ms=1.0, error=None)])
    assert store.read_calls("s") == [] and not store._calls_writing
    store.close()
