"""Commands that train the policy's weights with TRL: sft and grpo (the `train` extra)."""

from __future__ import annotations

import click

from skillstate.cli.app import cli, db_option, parse_sets, set_option
from skillstate.cli.train import check_outputs, json_events_option, train_and_report


def _policy_command(method: str, about: str):
    @click.argument("run_id", required=False, metavar="[RUN]")
    @click.option("--model", "base_model", type=click.Path(), metavar="DIR",
                  help="The policy to train: a local Hugging Face model directory (policy.base_model).")
    @click.option("--run-id", "new_id", help="The policy run's id; an existing one continues from its last checkpoint.")
    @click.option("--steps", type=click.IntRange(min=1), help="policy.max_steps.")
    @set_option
    @click.option("--quiet", "-q", is_flag=True, help="No progress lines or bar, only the summary.")
    @click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
    @json_events_option
    @db_option
    def command(run_id, base_model, new_id, steps, assignments, quiet, as_json, json_events, db) -> None:
        from skillstate.cli.live import JsonEvents, reporter
        from skillstate.policy import PolicyTrainer
        from skillstate.storage.store import open_store

        check_outputs(as_json, json_events)
        store = open_store(db, create=False, write=True)
        overrides = parse_sets(assignments)
        if steps is not None:
            overrides["policy.max_steps"] = steps
        if new_id is None or store.get_run(new_id) is None:  # a new policy run: from this run (default: the latest)
            run_id = store.require_run(run_id).run_id
            if base_model is None:
                raise click.UsageError("--model DIR is required: the local model to train")
        elif overrides or base_model:
            raise click.UsageError(f"run {new_id} exists: it continues as it started (no --model, --steps or --set)")
        events = JsonEvents(store, after=store.last_seq(new_id) if new_id and store.get_run(new_id) else 0) \
            if json_events else None
        progress = reporter(quiet=quiet, as_json=as_json, events=events)
        trainer = PolicyTrainer(store, method, source_run=run_id, base_model=base_model, overrides=overrides,
                                run_id=new_id, on_progress=progress)
        trainer.prepare()  # the run exists before training starts: an interruption names it
        train_and_report(trainer, as_json, progress, events)

    command.__doc__ = about
    return cli.command(method)(command)


sft = _policy_command("sft", """Train the policy's weights on a run's demonstrations (TRL's SFTTrainer, LoRA).

    The rows are the run's successful rollouts with the skills in context
    (those export-sft writes; --set policy.with_imported=true adds its
    imported trajectories). The policy is scored on val with the run's best
    skill or bank before training and after. Every metric and checkpoint is
    an event; the same command with the same --run-id, or `skillstate
    resume`, continues from the last checkpoint. Needs the train extra.

    \b
    Examples:
        skillstate sft bank-run --model ./Qwen2.5-0.5B-Instruct --steps 200
        skillstate sft --run-id sft-1      # continue after a crash
    """)

grpo = _policy_command("grpo", """Train the policy's weights with GRPO on a run's environment (TRL's GRPOTrainer, LoRA).

    Each train item is a prompt with the skills the run's bank retrieves
    for it; the reward is the environment's own scorer (the run's gate
    metric). Every policy.validation_interval steps the policy is scored on
    val per category, and the categories below bank.evolution_threshold are
    evolved by the teacher (journaled), kept only when the policy scores
    better with the evolved bank (SkillRL's recursive evolution). Needs the
    train extra; question-answering environments only.

    \b
    Examples:
        skillstate grpo bank-run --model ./Qwen2.5-0.5B-Instruct --steps 100 --set policy.num_generations=8
    """)
