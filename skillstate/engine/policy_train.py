"""One stretch of policy training with TRL: SFTTrainer on demonstrations or
GRPOTrainer on prompts with the environment's scorer as the reward, from the
last checkpoint to the next, which it writes.

The trainer is built for the whole schedule (`policy.max_steps`, a constant
learning rate) and stopped at the stretch's end, so stretches add up to one
uninterrupted training: each resumes from the checkpoint the one before
wrote (weights, optimizer, scheduler and RNG state), and a crash in the
middle of one re-runs it from there. Nothing is printed: TRL's progress bar
is off, and every metric it logs is returned for the event."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from skillstate.config_parts import PolicyConfig
from skillstate.engine.policy_model import quiet, use_threads
from skillstate.errors import TrainingFailure

Reward = Callable[..., list[float]]


def trainer_settings(cfg: PolicyConfig, method: str, seed: int) -> dict[str, Any]:
    """The settings recorded with the run (PolicyStarted.trainer_config): TRL's arguments and LoRA's."""
    args: dict[str, Any] = {
        "max_steps": cfg.max_steps, "per_device_train_batch_size": cfg.batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "learning_rate": cfg.learning_rate,
        "lr_scheduler_type": "constant", "logging_steps": 1, "seed": seed, "data_seed": seed, "use_cpu": True,
    }
    if method == "sft":
        args["max_length"] = cfg.max_length
    else:
        args.update(num_generations=cfg.num_generations, max_completion_length=cfg.max_completion_length,
                    temperature=cfg.temperature)
    lora = {"r": cfg.lora_r, "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
            "target_modules": cfg.lora_target_modules, "task_type": "CAUSAL_LM"} if cfg.lora else None
    return {"trainer": "SFTTrainer" if method == "sft" else "GRPOTrainer", "args": args, "lora": lora}


def _plain(logs: dict[str, Any], step: int) -> dict[str, float]:
    out = {"step": float(step)}
    for key, value in logs.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)  # NaN and infinities too: the stage refuses a diverged loss
    return out


def train_stretch(*, cfg: PolicyConfig, base: str, method: str, seed: int, output_dir: str,
                  rows: list[dict[str, Any]], reward: Reward | None, step_to: int,
                  resume: str | None) -> tuple[list[dict[str, float]], str]:
    """Train up to optimizer step `step_to` (from `resume`, a checkpoint, or from the base model); returns
    the metrics logged, by step, and the checkpoint written at `step_to`."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    settings = trainer_settings(cfg, method, seed)
    logged: list[dict[str, float]] = []

    class Stretch(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                logged.append(_plain(logs, state.global_step))

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= step_to:
                control.should_save = True
                control.should_training_stop = True

    use_threads(cfg.torch_threads)
    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(base)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        peft_config = None
        if settings["lora"] is not None:
            from peft import LoraConfig

            peft_config = LoraConfig(**settings["lora"])
        common = {**settings["args"], "output_dir": output_dir, "report_to": [], "save_strategy": "no",
                  "disable_tqdm": True}
        data = Dataset.from_list(rows)
        trainer: Any
        if method == "sft":
            from trl import SFTConfig, SFTTrainer

            trainer = SFTTrainer(model=base, args=SFTConfig(**common), train_dataset=data, peft_config=peft_config,
                                 processing_class=tokenizer, callbacks=[Stretch()])
        else:
            from trl import GRPOConfig, GRPOTrainer

            if reward is None:
                raise ValueError("GRPO needs a reward")
            funcs: list[Any] = [reward]
            trainer = GRPOTrainer(model=base, reward_funcs=funcs, args=GRPOConfig(**common), train_dataset=data,
                                  peft_config=peft_config, processing_class=tokenizer, callbacks=[Stretch()])
        trainer.train(resume_from_checkpoint=resume)
    checkpoint = Path(output_dir) / f"checkpoint-{step_to}"
    if not checkpoint.is_dir():
        raise TrainingFailure(f"the trainer stopped before step {step_to}: no checkpoint at {checkpoint}")
    return logged, str(checkpoint)
