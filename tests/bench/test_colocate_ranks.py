"""benchmarks/colocate_ranks.py: step time and tokens/s per GPU from two gpu_modes runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import colocate_ranks  # noqa: E402


def gpu_modes_out(root: Path, mode: str, wall: float, tokens: float) -> Path:
    """A gpu_modes output whose one cell stepped every ``wall`` s on ``tokens`` a step."""
    run_dir = root / "run"
    run_dir.mkdir(parents=True)
    lines = []
    for step in range(1, 9):
        data = {
            "loss": 0.1,
            "step_time": 0.5,
            "tokens_per_s": tokens / 0.5,
            "sync_time": 0.1,
            "reward/mean": step / 10,
        }
        record = {"process": "trainer", "step": step, "t": 100 + step * wall, "data": data}
        lines.append(json.dumps(record))
    lines.append(json.dumps({"process": "supervisor", "t": 101, "data": {"cpu": 1}}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    cell = {"mode": mode, "status": "ok", "run_dir": str(run_dir)}
    facts = {"date": "d", "device": "H200", "torch": "t", "vllm": "v"}
    (root / "gpu_modes.json").write_text(json.dumps({"facts": facts, "cells": [cell]}))
    return root


def test_tokens_per_gpu_and_the_ratio_against_the_goal(tmp_path: Path) -> None:
    colocate = gpu_modes_out(tmp_path / "c", "colocate", wall=1.0, tokens=4000)
    split = gpu_modes_out(tmp_path / "s", "shared_vllm", wall=2.0, tokens=4000)
    out = tmp_path / "colocate_ranks.md"
    args = ["--colocate", str(colocate), "--split", str(split), "--out", str(out)]
    assert colocate_ranks.main(args) == 0
    text = out.read_text()
    # 4000 tokens a step every 1.0 s on 2 GPUs = 2000; every 2.0 s = 1000
    assert "| colocate x2 | colocate | ok | 8 | 1.000 | 0.500 | 0.100 | 4000 | 2000 |" in text
    assert "| split | shared_vllm | ok | 8 | 2.000 | 0.500 | 0.100 | 4000 | 1000 |" in text
    assert "0.200 -> 0.700" in text  # mean reward of steps 1-3 vs steps 6-8
    assert "**2.00x** (goal >= 1.3x: met)" in text


def test_a_layout_that_did_not_run_is_reported_not_invented(tmp_path: Path) -> None:
    colocate = gpu_modes_out(tmp_path / "c", "colocate", wall=1.0, tokens=4000)
    split = gpu_modes_out(tmp_path / "s", "none", wall=2.0, tokens=4000)
    out = tmp_path / "colocate_ranks.md"
    colocate_ranks.main(["--colocate", str(colocate), "--split", str(split), "--out", str(out)])
    assert "| split | shared_vllm | not run |" in out.read_text()
    assert "not measured (a layout did not run)" in out.read_text()
