"""The local policy of a policy training run: the identity of a model
directory (a hash of its files), and the policy at a checkpoint answering
an environment's requests on this machine (greedy, through the tokenizer's
chat template), so that the environment's own rollout and scorer judge it.

torch, transformers and peft (the `train` extra) are imported when used, never
at import time."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from skillstate.errors import ConfigError
from skillstate.llm.base import CallResult
from skillstate.log.events_policy import ModelIdentity
from skillstate.log.values import CallRef
from skillstate.util import canonical_json, install_hint, sha256_text

TRAIN_EXTRA = install_hint("train")


def require_training_libraries() -> None:
    """A one-line error when the `train` extra is missing."""
    from importlib.util import find_spec

    missing = [name for name in ("torch", "transformers", "trl", "peft", "datasets") if find_spec(name) is None]
    if missing:
        raise ConfigError(f"policy training needs {', '.join(missing)}: {TRAIN_EXTRA} (torch's CPU build)")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The libraries' warnings, notices and progress bars kept out of the user's terminal (the library never
    prints; what matters is in the events)."""
    import datasets
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), datasets.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    loggers = [logging.getLogger(n) for n in ("trl", "peft", "accelerate", "datasets", "huggingface_hub")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()
        if bars:
            datasets.enable_progress_bars()
        for lg, lv in zip(loggers, levels, strict=True):
            lg.setLevel(lv)


def use_threads(count: int) -> None:
    """torch's CPU threads (`policy.torch_threads`; 0 leaves its default)."""
    if count > 0:
        import torch

        torch.set_num_threads(count)


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


# (the files hashed, each with its size and modification time) -> their hash: a folder checked at every stage
# of a policy run (the base model, the last checkpoint) is read once per process while none of its files changes
_HASHED: dict[tuple[tuple[str, int, int], ...], str] = {}


def files_sha256(folder: str | Path, names: list[str] | None = None) -> tuple[str, int]:
    """(SHA-256 over each file's relative name and content, in name order; the number of files). With `names`,
    only those files (those missing are skipped)."""
    root = Path(folder)
    chosen = sorted(p for p in root.rglob("*") if p.is_file()) if names is None else \
        sorted(p for n in names if (p := root / n).is_file())
    stats = tuple((str(p.resolve()), (st := p.stat()).st_size, st.st_mtime_ns) for p in chosen)
    if (known := _HASHED.get(stats)) is not None:
        return known, len(chosen)
    digest = hashlib.sha256()
    for path in chosen:
        digest.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    _HASHED[stats] = digest.hexdigest()
    return _HASHED[stats], len(chosen)


def model_identity(path: str) -> ModelIdentity:
    """The identity of a local model directory; a one-line error when it is not one."""
    root = Path(path)
    if not root.is_dir() or not (root / "config.json").is_file():
        raise ConfigError(f"policy.base_model {path}: not a Hugging Face model directory (no config.json); "
                          "training needs the model on disk, it is never downloaded")
    sha, count = files_sha256(root)
    return ModelIdentity(path=str(root.resolve()), sha256=sha, files=count)


def check_base_model(path: str) -> None:
    """The model and its tokenizer load, and the tokenizer has a chat template (the prompts are
    conversations): a one-line error otherwise, before any run is written."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        with quiet():
            AutoConfig.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as err:  # whatever transformers raises on a folder it cannot read
        raise ConfigError(f"policy.base_model {path}: transformers cannot load it: {type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else 'no message'}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"policy.base_model {path}: its tokenizer has no chat template, and the prompts are "
                          "conversations: use an instruct or chat model")


def check_output_dir(path: str) -> None:
    """The checkpoint folder can be made and written to."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".skillstate-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"policy.output_dir {path}: cannot write checkpoints there ({err.strerror or err})") \
            from None


ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"]
WEIGHT_FILES = ["config.json", "model.safetensors", "pytorch_model.bin"]


def checkpoint_sha256(path: str | Path) -> str:
    """The hash of what a checkpoint holds of the policy: the LoRA adapter, or the weights when every weight
    was trained (the optimizer's state is not part of it)."""
    root = Path(path)
    names = ADAPTER_FILES if (root / "adapter_config.json").is_file() else WEIGHT_FILES
    return files_sha256(root, names)[0]


class LocalPolicy:
    """The base model, with the checkpoint's adapter when there is one, answering chat requests greedily."""

    def __init__(self, base_model: str, checkpoint: str | None, max_new_tokens: int, threads: int = 0):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        use_threads(threads)
        self._torch = torch
        adapter = checkpoint is not None and (Path(checkpoint) / "adapter_config.json").is_file()
        with quiet():
            self.tokenizer: Any = AutoTokenizer.from_pretrained(base_model)
            model: Any = AutoModelForCausalLM.from_pretrained(checkpoint if checkpoint and not adapter else base_model)
            if adapter:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(checkpoint))
        self.model = model.eval()
        self.max_new_tokens = max_new_tokens

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> CallResult:
        torch = self._torch
        chat = [{"role": m["role"], "content": str(m.get("content") or "")} for m in messages]
        ids: Any = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        with torch.no_grad(), quiet():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.eos_token_id if self.tokenizer.pad_token_id is None
                                      else self.tokenizer.pad_token_id)
        prompt_len = ids["input_ids"].shape[1]
        new = out[0][prompt_len:]
        text = str(self.tokenizer.decode(new, skip_special_tokens=True))
        ref = CallRef(request_hash=sha256_text(canonical_json(chat)), role="policy", prompt_tokens=int(prompt_len),
                      completion_tokens=int(new.shape[0]))
        return CallResult(ref=ref, text=text.strip(), truncated=int(new.shape[0]) >= self.max_new_tokens)
