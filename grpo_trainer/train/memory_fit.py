"""Will the trainer fit beside vLLM on one GPU? The arithmetic, with the numbers in the answer.

On a GPU that vLLM shares with the trainer (``shared_vllm`` zero-copy, ``colocate``), vLLM
takes ``gpu_memory_utilization`` of the card while it generates; what the trainer keeps on
the GPU at that time must fit in the rest, or the run dies of OOM at its first step:

- ``shared_vllm``: the weights are vLLM's (counted in its share); the trainer keeps the
  optimizer state (gradients are freed after each step).
- ``colocate`` on vLLM: vLLM's sleep takes its own weights with it, so the trainer keeps
  its own copy: weights + optimizer state. (Activations and gradients come while vLLM
  sleeps, in the memory it released.)
- An FSDP2 trainer of N ranks (``colocate`` on N GPUs) keeps float32 master shards and
  their optimizer state, 1/N of them on each GPU (bf16 is only its compute dtype).

``grpo-tui check`` runs this when the profile gives ``inference.gpu_memory_gb`` and the
model's ``config.json`` is on disk; the trainer runs it at start-up on CUDA with the real
numbers (NVML's total, the memory free once vLLM and the model are loaded). Torch-free.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
OPTIMIZER_STATES = {"adamw": 2.0, "adamw_8bit": 0.5, "adafactor": 0.1}
"""Optimizer state per parameter, in parameter-sized units: AdamW keeps two moments in the
parameter's dtype; 8-bit AdamW two one-byte moments (x 0.5 of bf16); Adafactor factored
second moments (a small fraction; 0.1 is generous)."""
GB = 1e9


class GpuDoesNotFit(RuntimeError):
    """The trainer would run out of GPU memory beside vLLM; the message has the numbers."""


def read_model_config(model: str) -> dict[str, Any] | None:
    """``config.json`` of a local model directory or of a hub id already in the HF cache
    (no download: ``check`` stays offline); None when neither is on disk."""
    path: Path | None = Path(model) / "config.json"
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "config.json")
        except ValueError:  # not a hub id either
            return None
        path = Path(cached) if isinstance(cached, str) else None
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def param_count(config: Mapping[str, Any]) -> int:
    """Parameters of a decoder-only HF config (Llama / Qwen2 / Mistral layout)."""
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    vocab = int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = hidden * q + 2 * hidden * kv + q * hidden
    if config.get("model_type") == "qwen2" or config.get("attention_bias"):
        attention += q + 2 * kv
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + hidden


@dataclass(frozen=True)
class TrainerFootprint:
    """What the trainer keeps on the GPU while vLLM generates, in bytes."""

    params: int
    dtype: str
    optimizer: str
    own_weights: bool
    shards: int = 1
    """FSDP2 ranks the weights and optimizer state are sharded over (one per GPU)."""

    @property
    def state_dtype(self) -> str:
        """The dtype of the kept weights and state: float32 masters when sharded."""
        return "float32" if self.shards > 1 else self.dtype

    @property
    def weight_bytes(self) -> int:
        if not self.own_weights:
            return 0
        return math.ceil(self.params * DTYPE_BYTES[self.state_dtype] / self.shards)

    @property
    def optimizer_bytes(self) -> int:
        unit = DTYPE_BYTES[self.state_dtype] * OPTIMIZER_STATES[self.optimizer]
        return math.ceil(self.params * unit / self.shards)

    @property
    def total(self) -> int:
        return self.weight_bytes + self.optimizer_bytes

    def describe(self) -> str:
        """``1.54e9 params x (2 B weights + 4 B adamw state) = 9.3 GB``."""
        unit = DTYPE_BYTES[self.state_dtype]
        state = unit * OPTIMIZER_STATES[self.optimizer]
        weights = f"{unit} B weights + " if self.own_weights else ""
        sharded = f" / {self.shards} ranks (float32 masters)" if self.shards > 1 else ""
        return (
            f"{self.params:.3g} params x ({weights}{state:g} B {self.optimizer} state)"
            f"{sharded} = {self.total / GB:.1f} GB"
        )


def footprint(
    mode: str, params: int, dtype: str, optimizer: str, backend: str, *, shards: int = 1
) -> TrainerFootprint | None:
    """The footprint in ``mode`` per GPU (``shards`` FSDP2 ranks), or None where the
    trainer does not share vLLM's GPU."""
    if backend != "vllm" or mode not in ("shared_vllm", "colocate"):
        return None
    own = mode == "colocate" or shards > 1  # ranks keep their own master shards
    return TrainerFootprint(params, dtype, optimizer, own_weights=own, shards=shards)


def fit_problem(need: TrainerFootprint, *, total_gb: float, utilization: float) -> str | None:
    """Static check: the trainer's footprint against the GPU left after vLLM's share."""
    left = total_gb * (1.0 - utilization)
    if need.total / GB <= left:
        return None
    most = max(0.0, math.floor((1.0 - need.total / GB / total_gb) * 100) / 100)
    return (
        f"the trainer does not fit beside vLLM: it keeps {need.describe()} on the GPU while "
        f"vLLM generates, but gpu_memory_utilization {utilization:g} of {total_gb:g} GB leaves "
        f"{left:.1f} GB; use gpu_memory_utilization <= {most:.2f}, a smaller model or a LoRA mode"
    )


def startup_problem(need: TrainerFootprint, *, free_bytes: int, total_bytes: int) -> str | None:
    """Start-up check on the real GPU: what is still to be allocated against what is free.

    Called once the model (and vLLM beside it) is loaded: the weights already sit on the
    GPU, the optimizer state is still to come.
    """
    if need.optimizer_bytes <= free_bytes:
        return None
    return (
        f"the trainer will not fit beside vLLM: {need.describe()}; the optimizer state "
        f"({need.optimizer_bytes / GB:.1f} GB) is still to be allocated but only "
        f"{free_bytes / GB:.1f} GB of the GPU's {total_bytes / GB:.1f} GB is free with vLLM "
        "and the model loaded; lower inference.gpu_memory_utilization, use a smaller model "
        "or a LoRA mode"
    )
