"""Requests a model server can cache: the skill is the first thing a
rollout sends and nothing variable comes before it, and in bank mode
(where each item's system prompt is the skills retrieved for it) a stage's
rollouts go out grouped by that prompt, while what the log records stays
what it was."""

from __future__ import annotations

import json
import threading

from conftest import small_config

from skillstate.engine.runner import make_backend
from skillstate.storage.store import Store
from skillstate.trainer import Trainer, evaluate_skill


def recording_factory(seen: list):
    """Backends that note the messages of every target request, in the order sent."""
    lock = threading.Lock()

    def factory(config, env, role):
        real = make_backend(config, env, role)

        class Noting:
            name = real.name

            def complete(self, request):
                if role == "target":
                    with lock:
                        seen.append(request.messages)
                return real.complete(request)

        return Noting()

    return factory


def test_a_rollout_sends_the_skill_first_and_the_item_after_it(tmp_path):
    skill = tmp_path / "skill.md"
    skill.write_text("# Answering\n\nGive the answer alone.\n")
    seen: list = []
    evaluate_skill(small_config(initial_skill=str(skill), concurrency=1), "val", db=f"sqlite:///{tmp_path / 'e.db'}",
                   backend_factory=recording_factory(seen))
    assert len(seen) == 60
    assert all(m[0] == ("system", skill.read_text()) for m in seen)  # the same first message
    assert all(len(m) == 2 and m[1][0] == "user" for m in seen) and len({m[1][1] for m in seen}) == 60  # the item


def _runs(prompts: list[str]) -> int:
    """How many runs of equal neighbours the sequence has."""
    return sum(1 for n, p in enumerate(prompts) if n == 0 or p != prompts[n - 1])


def test_bank_rollouts_go_out_grouped_by_their_prompt_and_the_log_is_unchanged(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'b.db'}")
    bank = Trainer(small_config(mode="bank", num_epochs=1), store=store, run_id="learn").train().best_skill
    path = tmp_path / "bank.json"
    path.write_text(bank)
    seen: list = []
    config = small_config(mode="bank", initial_skill=str(path), concurrency=1)
    store = Store(f"sqlite:///{tmp_path / 'eval.db'}")  # nothing to serve from the learning run's calls
    result = evaluate_skill(config, "val", store=store, run_id="grouped", backend_factory=recording_factory(seen))
    prompts = [m[0][1] for m in seen]
    assert len(prompts) == 60 and len(set(prompts)) > 1
    assert _runs(prompts) == len(set(prompts))  # each prompt's rollouts in one run, none split up
    assert prompts == sorted(prompts)
    # the val split interleaves its task types, and the results stay in its order
    (evaluated,) = [e.event for e in store.read_events("grouped") if e.event.type == "TestEvaluated"]
    items = [r["item_id"] for r in json.loads(store.get_blob(evaluated.results))]
    assert items == sorted(items) and result.summary["usage"]["target"]["sent"] == 60
