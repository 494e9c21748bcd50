"""vLLM's fused parameter layout <-> Hugging Face parameter names.

vLLM stores ``q_proj``/``k_proj``/``v_proj`` as one ``qkv_proj`` and ``gate_proj``/
``up_proj`` as one ``gate_up_proj`` (rows stacked in that order) and pads the vocabulary
rows of ``embed_tokens``/``lm_head``. Slicing rows of a row-major tensor is a view, so each
HF parameter maps onto a slice of vLLM's storage with no copy (tensor parallel size 1):
``hf_views``. The other way, ``kernel_tensors`` builds vLLM's tensors from HF-named ones,
one fused tensor at a time, for a transfer in vLLM's own layout.
"""

from __future__ import annotations

from collections.abc import Iterator
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


def hf_parts(vllm_name: str) -> list[str]:
    """The HF parameter names stacked (in order) into vLLM's ``vllm_name``."""
    fused = next((key for key in FUSED if f".{key}." in vllm_name), None)
    if fused is None:
        return [vllm_name]
    return [vllm_name.replace(f".{fused}.", f".{part}.") for part in FUSED[fused]]


def kernel_tensors(
    named: Iterator[tuple[str, torch.Tensor]], layout: list[tuple[str, list[int], str]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """vLLM's tensors ``(name, tensor)`` in ``layout`` order, built from HF-named tensors.

    ``layout`` is vLLM's ``(name, shape, dtype)`` per parameter. Fused tensors are stacked
    from their parts, vocabulary rows padded with zeros, dtypes cast to vLLM's. ``named`` is
    consumed lazily and each part is dropped once used, so only the tensors of the fused
    group at hand are held at a time (with sharded training: one gathered group).
    Raises ``ValueError`` when a part is missing, a shape does not match, or ``named``
    holds a parameter vLLM has no place for (it would silently stay stale).
    """
    pending: dict[str, torch.Tensor] = {}
    for name, shape, dtype in layout:
        parts = hf_parts(name)
        while missing := [part for part in parts if part not in pending]:
            try:
                hf_name, tensor = next(named)
            except StopIteration:
                raise ValueError(f"no trainer parameter {missing[0]} for vLLM's {name}") from None
            pending[hf_name] = tensor
        pieces = [pending.pop(part) for part in parts]
        tensor = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)
        if tensor.dim() and tensor.shape[0] < shape[0] and any(k in name for k in VOCAB_ROWS):
            pad = tensor.new_zeros((shape[0] - tensor.shape[0], *tensor.shape[1:]))
            tensor = torch.cat([tensor, pad], dim=0)
        if list(tensor.shape) != list(shape):
            raise ValueError(f"{name}: the trainer builds {list(tensor.shape)}, vLLM has {shape}")
        yield name, tensor.to(getattr(torch, dtype))
    extra = [*pending, *(hf_name for hf_name, _ in named)]
    if extra:
        raise ValueError(f"vLLM holds no tensor for the trainer's {extra[0]}")
