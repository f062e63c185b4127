"""A tiny random-weight causal LM and its character-level tokenizer, built
on this machine with no download: what the offline tests and the smoke
benchmark train (`skillstate.engine.tiny_model.write_tiny_model(folder)`).
Its answers are noise until trained; the point is the whole path, TRL
included, in seconds on a CPU."""

from __future__ import annotations

from pathlib import Path

from skillstate.engine.policy_model import quiet

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def write_tiny_model(folder: str | Path, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A Llama-shaped model (~100k parameters) and a tokenizer of printable ASCII characters with a chat
    template, saved as a Hugging Face model directory."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(folder)
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {token: i for i, token in enumerate(SPECIAL + chars)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    with quiet():
        LlamaForCausalLM(config).save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out
