"""Helpers for the built-in server tests: ports, adapters, limits the fixtures use."""

from __future__ import annotations

from pathlib import Path

import httpx
import torch
from free_ports import free_port as free_port
from peft import LoraConfig, get_peft_model

from grpo_trainer.models import load_model

MAX_MODEL_LEN = 64
MAX_NUM_SEQS = 16


def completion(url: str, prompt: str, max_tokens: int, n: int = 1) -> dict:
    """``POST /v1/completions`` to the served ``policy``: ``n`` choices of exactly
    ``max_tokens`` tokens with their ids; asserts 200 and returns the JSON body."""
    body = {
        "model": "policy",
        "prompt": prompt,
        "n": n,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def make_adapter(base_dir: Path, out: Path, *, rank: int = 4, seed: int = 0) -> Path:
    """A LoRA adapter with non-zero weights (so it changes outputs) for ``base_dir``."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(load_model(base_dir), config).save_pretrained(out)
    return out
