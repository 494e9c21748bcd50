"""Qwen2 shapes the GPU benchmarks build at random init (no downloads): real vocabulary size.

Imported by the benchmark scripts beside this file (run as ``python benchmarks/X.py``, so
this folder is on ``sys.path``).
"""

from __future__ import annotations

from typing import Any

QWEN_VOCAB = 151936

SHAPES: dict[str, dict[str, Any]] = {
    "small": {
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": QWEN_VOCAB,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": QWEN_VOCAB,
        "tie_word_embeddings": True,
    },
    "qwen2.5-3b": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": QWEN_VOCAB,
        "tie_word_embeddings": True,
    },
    "qwen2.5-7b": {  # config.json of Qwen/Qwen2.5-7B-Instruct: untied head, vocabulary 152,064
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
}
"""Keyword arguments of ``transformers.Qwen2Config`` per shape name."""


def qwen2_config(shape: str, max_position_embeddings: int = 2048) -> Any:
    """The ``Qwen2Config`` of ``shape`` (bf16 weights)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        **SHAPES[shape],
        max_position_embeddings=max_position_embeddings,
        torch_dtype="bfloat16",
    )
