"""benchmarks/nccl_sync.py's CPU-side pieces: the update sparsity it measures, the nudge that
reproduces it on the served model, and the variant table."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import nccl_sync  # noqa: E402


def test_a_smaller_learning_rate_changes_fewer_bf16_elements() -> None:
    """One AdamW step on float32 masters: the share of bf16 values that move grows with lr."""
    low, high = (nccl_sync.update_sparsity("small", lr, "cpu") for lr in (1e-6, 1e-4))
    assert 0 < low < high < 1


def test_nudge_changes_about_the_asked_share_by_one_ulp() -> None:
    params = [torch.randn(200_000).to(torch.bfloat16), torch.randn(3, 1000).to(torch.bfloat16)]
    before = [p.clone() for p in params]
    nccl_sync.nudge(params, 0.05, torch.Generator().manual_seed(0))
    moved = sum(int((p != b).sum()) for p, b in zip(params, before, strict=True))
    assert 0.045 < moved / 203_000 < 0.055
    step = (params[0].float() - before[0].float()).abs()
    ulp = before[0].float().abs() * 2**-7  # one bf16 ulp is at most 2^-7 of the value
    assert bool((step <= ulp + 1e-30).all())


def test_variant_table_reports_each_row_against_the_raw_broadcast() -> None:
    row = {
        "shape": "qwen2.5-7b", "bytes": 15.2e9, "flat_s": [0.045], "sparsity": {1e-6: 0.012},
        "variants": [
            {"variant": "full", "lr": None, "sync_s": [0.3, 0.32],
             "phases": {"pause": 0.04, "transfer": 0.2}},
            {"variant": "delta", "lr": 1e-6, "sync_s": [0.2], "phases": {"transfer": 0.1},
             "bytes_sent": 1.1e9, "changed": 0.012},
            {"variant": "keep", "lr": None, "error": "HTTPStatusError: 400"},
        ],
    }  # fmt: skip
    text = "\n".join(nccl_sync.variant_table([row]))
    assert "lr 1e-06: 1.20%" in text
    assert "| full | - | 310 ms (300-320) | pause 40, transfer 200 | 15.200 GB | 6.9x |" in text
    assert "| delta | 1e-06 | 200 ms (200-200) | transfer 100 | 1.100 GB | 4.4x |" in text
    assert "| keep | - | error: HTTPStatusError: 400 |" in text
