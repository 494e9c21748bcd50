"""vLLM's fused parameter layout -> Hugging Face parameter names, as zero-copy views.

vLLM stores ``q_proj``/``k_proj``/``v_proj`` as one ``qkv_proj`` and ``gate_proj``/
``up_proj`` as one ``gate_up_proj`` (rows stacked in that order) and pads the vocabulary
rows of ``embed_tokens``/``lm_head``. Slicing rows of a row-major tensor is a view, so each
HF parameter maps onto a slice of vLLM's storage with no copy (tensor parallel size 1).
"""

from __future__ import annotations

from typing import Any

import torch

FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
VOCAB_ROWS = ("embed_tokens", "lm_head")


def split_sizes(config: Any) -> dict[str, list[int]]:
    """Rows of each part of the fused projections, from a HF model config."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads) * head_dim
    inter = int(config.intermediate_size)
    return {"qkv_proj": [heads * head_dim, kv, kv], "gate_up_proj": [inter, inter]}


def hf_views(vllm_params: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """HF name -> view into vLLM's tensors, for every parameter vLLM holds."""
    sizes = split_sizes(config)
    vocab = int(config.vocab_size)
    views: dict[str, torch.Tensor] = {}
    for name, tensor in vllm_params.items():
        fused = next((key for key in FUSED if f".{key}." in name), None)
        if fused is not None:
            if sum(sizes[fused]) != tensor.shape[0]:
                raise ValueError(f"{name} has {tensor.shape[0]} rows, expected {sizes[fused]}")
            start = 0
            for part, rows in zip(FUSED[fused], sizes[fused], strict=True):
                views[name.replace(f".{fused}.", f".{part}.")] = tensor.narrow(0, start, rows)
                start += rows
        elif any(f"{key}." in name for key in VOCAB_ROWS):
            views[name] = tensor[:vocab]
        else:
            views[name] = tensor
    return views
