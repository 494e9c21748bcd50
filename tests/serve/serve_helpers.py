"""Helpers for the built-in server tests: ports, adapters, limits the fixtures use."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from grpo_trainer.models import load_model

MAX_MODEL_LEN = 64
MAX_NUM_SEQS = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_adapter(base_dir: Path, out: Path, *, rank: int = 4, seed: int = 0) -> Path:
    """A LoRA adapter with non-zero weights (so it changes outputs) for ``base_dir``."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(load_model(base_dir), config).save_pretrained(out)
    return out
