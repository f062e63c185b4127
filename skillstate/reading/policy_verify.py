"""`replay --verify` of a policy training run. Training is not re-executed
(it would take as long as it took, and a GPU's or a CPU's arithmetic is
not bit-exact across machines); instead each recorded outcome is checked
against what it rests on:

- every checkpoint still holds the adapter (or weights) whose hash its event
  recorded;
- every evolution's teacher call is in the journal with its reply, the
  evolved bank is the base bank with the recorded skills folded in, and the
  decision follows from the recorded scores (kept only when strictly
  better)."""

from __future__ import annotations

from skillstate.bank.document import bank_text, read_bank
from skillstate.engine.loading import LoadedRun
from skillstate.engine.policy_model import checkpoint_sha256
from skillstate.log.events_policy import PolicyBankEvolved, PolicyTrained
from skillstate.storage.store import Store
from skillstate.util import sha256_text


def policy_divergence(store: Store, loaded: LoadedRun) -> tuple[str, int] | None:
    """(what does not hold, at which event's seq), or None when everything checks."""
    for stored in loaded.own:
        event = stored.event
        if isinstance(event, PolicyTrained):
            ck = event.checkpoint
            try:
                found = checkpoint_sha256(ck.path)
            except OSError:
                found = None
            if found != ck.sha256:
                return (f"checkpoint {ck.path} (step {ck.step}) is missing or no longer what was written", stored.seq)
        elif isinstance(event, PolicyBankEvolved):
            if event.status in ("ok", "unparseable") and event.call is not None \
                    and store.find_call(event.call.request_hash) is None:
                return f"the teacher call {event.call.request_hash[:12]} is not in the journal", stored.seq
            if event.candidate is not None:
                evolved = bank_text(read_bank(store.get_blob(event.base_skill)).with_skills(event.added))
                if sha256_text(evolved) != event.candidate:
                    return "the evolved bank is not the base bank with the skills the teacher added", stored.seq
                if event.candidate_score is None or event.base_score is None:
                    return "an evolved bank with no score", stored.seq
                if event.accepted != (event.candidate_score > event.base_score):
                    return "the evolved bank's decision does not follow from its scores", stored.seq
            elif event.accepted:
                return "an evolution accepted with no bank", stored.seq
    return None
