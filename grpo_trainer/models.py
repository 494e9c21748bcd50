"""Model and tokenizer loading, and the tiny-model builder used offline.

``build_tiny_model`` writes a real Hugging Face model directory (Qwen2 architecture,
safetensors weights, a ``tokenizers`` tokenizer with eos/pad tokens and a chat template) so
that tests and the offline quickstart run the same loading code as a hub model would.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, IM_START, IM_END)
DEFAULT_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz :\n"
QWEN2_PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _byte_level_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable-character table, the alphabet of byte-level BPE."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def filler_tokens(count: int, alphabet: str = DEFAULT_ALPHABET) -> list[str]:
    """``count`` distinct multi-character tokens over the letters and digits of ``alphabet``.

    No merge produces them, so encoding never yields one; decoding one gives its text. They
    pad a tiny vocabulary to a real model's size (Qwen2.5: 151,936) so that every token a
    randomly initialised model samples decodes to text.
    """
    letters = sorted({c for c in alphabet if c.isalnum()})
    out: list[str] = []
    width = 2
    while len(out) < count:
        for combo in itertools.product(letters, repeat=width):
            out.append("".join(combo))
            if len(out) == count:
                break
        width += 1
    return out


def build_tiny_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, vocab_size: int | None = None
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges: one token per character of ``alphabet``.

    It uses Qwen2's own pre-tokenizer and byte-level scheme, so it tokenizes the same
    whichever class loads it (transformers rebuilds Qwen2 tokenizers from vocab and merges).
    ``vocab_size`` pads the vocabulary with :func:`filler_tokens` up to that size.
    """
    symbols = _byte_level_symbols()
    chars = [symbols[b] for b in dict.fromkeys(alphabet.encode())]
    tokens = [*SPECIAL_TOKENS, *chars]
    if vocab_size is not None:
        if vocab_size < len(tokens):
            raise ValueError(f"vocab_size {vocab_size} is below the {len(tokens)} base tokens")
        tokens += filler_tokens(vocab_size - len(tokens), alphabet)
    vocab = {token: i for i, token in enumerate(tokens)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )


def build_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    alphabet: str = DEFAULT_ALPHABET,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    initializer_range: float = 0.02,
    final_norm_weight: float = 6.0,
    dtype: str = "float32",
) -> Path:
    """Write a randomly initialised Qwen2 model and its tokenizer to ``path``.

    Deterministic for a given seed and shape; loadable by ``AutoModelForCausalLM``,
    ``AutoTokenizer`` and vLLM. ``final_norm_weight`` is the initial weight of the last
    RMSNorm (Qwen2's own init: 1). The tied head's logits are bounded by about
    ``final_norm_weight * hidden_size * initializer_range``: 1.3 at weight 1, too flat for
    a policy that trains neither the norm nor the embeddings (LoRA on the linear layers) to
    ever become peaked; 7.7 at weight 6 (docs/environments.md, full FT vs LoRA).
    ``dtype`` is the dtype of the saved weights (initialised in float32, then cast):
    ``bfloat16`` halves the files of a large shape (profiles/qwen2.5-7b-1gpu.toml: 13 GB
    instead of 26) for servers and trainers that load it in bf16 anyway.
    """
    path = Path(path)
    tokenizer = build_tiny_tokenizer(alphabet)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(final_norm_weight)
    model = model.to(DTYPES[dtype])
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer by hub id or local path; a missing pad token falls back to eos."""
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def adapter_base(adapter_path: str | Path) -> str:
    """The base model an adapter directory was trained on (from its adapter_config.json)."""
    config = json.loads((Path(adapter_path) / "adapter_config.json").read_text())
    return str(config["base_model_name_or_path"])


def load_model(
    name_or_path: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    gradient_checkpointing: bool = False,
    adapter: str | Path | None = None,
    trainable_adapter: bool = False,
) -> PreTrainedModel:
    """Load a causal LM by hub id or local path, optionally with a peft LoRA adapter on top."""
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=DTYPES[dtype])
    model.to(device)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable_adapter)
    return model
