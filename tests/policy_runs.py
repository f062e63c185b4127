"""A database holding a skill-bank run `bank` on examples/qa and two policy runs trained from it on a tiny
random-weight model (no download): `sft` (4 steps, validated at 0 and 4) and `grpo` (4 steps, validated at
0, 2 and 4, and one evolution of the bank at step 2). Shared by the tests of what shows a policy run."""

from __future__ import annotations

from pathlib import Path

from conftest import EXAMPLES, small_config

from skillstate.storage.store import Store
from skillstate.trainer import Trainer

FAST = {"policy.torch_threads": 1, "policy.eval_max_new_tokens": 6, "policy.max_completion_length": 6,
        "policy.batch_size": 4, "policy.num_generations": 4, "policy.max_steps": 4, "policy.save_steps": 2}


def policy_database(base: Path) -> str:
    """Build the runs in `base`; the database's URL."""
    from skillstate.engine.tiny_model import write_tiny_model
    from skillstate.policy import PolicyTrainer

    url = f"sqlite:///{base / 'p.db'}"
    store = Store(url)
    Trainer(small_config(mode="bank", data=str(EXAMPLES / "qa"), batch_size=12), store=store, run_id="bank").train()
    model = write_tiny_model(base / "tiny")
    for method, extra in (("sft", {"policy.validation_interval": 4}),
                          ("grpo", {"policy.validation_interval": 2, "bank.evolution_threshold": 1.0})):
        sets = {**FAST, "policy.output_dir": str(base / method), **extra}
        PolicyTrainer(store, method, source_run="bank", base_model=str(model), overrides=sets,
                      run_id=method).train()
    store.close()
    return url
