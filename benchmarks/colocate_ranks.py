"""``colocate`` on both GPUs vs the split layout: step time and tokens/s per GPU.

Reads two ``benchmarks/gpu_modes.py`` outputs of the same model and global batch (its
``gpu_modes.json`` and each cell's run directory): ``--layout colocate`` (2 FSDP2 ranks and
2 vLLM replicas, one of each per GPU, mode ``colocate``) and ``--layout split`` (the trainer
on GPU 0, vLLM alone on GPU 1, ``shared_vllm`` over NCCL). Per layout, from the trainer's
per-step records after ``--skip`` warm-up steps: wall seconds per step (between successive
step records: generation, training and sync together), the trainer's own step time, tokens
per step (``tokens_per_s x step_time``: prompt and completion tokens trained), tokens/s per
GPU (tokens per step / wall seconds per step / GPUs), sync time, and the reward first ->
last. Issue 13's goal: colocate >= 1.3x the split layout's tokens/s per GPU.

    python benchmarks/colocate_ranks.py --colocate OUT/colocate --split OUT/split \\
        --out OUT/colocate_ranks.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOAL = 1.3
GPUS = 2


@dataclass(frozen=True)
class Layout:
    """What one layout's run measured (None: not measured)."""

    name: str
    mode: str
    status: str
    steps: int
    wall_s: float | None
    step_s: float | None
    sync_s: float | None
    tokens: float | None
    reward: tuple[float, float] | None

    @property
    def tokens_per_gpu_s(self) -> float | None:
        if self.tokens is None or not self.wall_s:
            return None
        return self.tokens / self.wall_s / GPUS


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def read_layout(name: str, out_dir: Path, mode: str, skip: int, window: int) -> Layout:
    """The ``mode`` cell of the gpu_modes run in ``out_dir``."""
    raw = json.loads((out_dir / "gpu_modes.json").read_text())
    cell = next((c for c in raw["cells"] if c["mode"] == mode), None)
    if cell is None:
        return Layout(name, mode, "not run", 0, None, None, None, None, None)
    steps: list[dict[str, Any]] = []
    metrics = Path(cell["run_dir"]) / "metrics.jsonl" if cell["run_dir"] else None
    if metrics is not None and metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if record.get("process") == "trainer" and "loss" in record.get("data", {}):
                steps.append(record)
    kept = steps[skip:]
    walls = [b["t"] - a["t"] for a, b in itertools.pairwise(kept)]
    data = [r["data"] for r in kept]
    rewards = [r["data"]["reward/mean"] for r in steps]
    return Layout(
        name=name,
        mode=mode,
        status=cell["status"],
        steps=len(steps),
        wall_s=_median(walls),
        step_s=_median([d["step_time"] for d in data]),
        sync_s=_median([d["sync_time"] for d in data if "sync_time" in d]),
        tokens=_median([d["tokens_per_s"] * d["step_time"] for d in data]),
        reward=(
            (statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:]))
            if len(rewards) >= 2 * window
            else None
        ),
    )


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(colocate: Layout, split: Layout, facts: dict[str, str], skip: int) -> str:
    rows = [
        "| layout | mode | status | steps | wall s / step | trainer step s | sync s | tokens "
        "/ step | tokens/s per GPU | reward first -> last |",
        "|" + "---|" * 10,
    ]
    for layout in (colocate, split):
        reward = f"{layout.reward[0]:.3f} -> {layout.reward[1]:.3f}" if layout.reward else "n/a"
        rows.append(
            f"| {layout.name} | {layout.mode} | {layout.status} | {layout.steps} "
            f"| {_fmt(layout.wall_s, '.3f')} | {_fmt(layout.step_s, '.3f')} "
            f"| {_fmt(layout.sync_s, '.3f')} | {_fmt(layout.tokens, '.0f')} "
            f"| {_fmt(layout.tokens_per_gpu_s, '.0f')} | {reward} |"
        )
    ours, theirs = colocate.tokens_per_gpu_s, split.tokens_per_gpu_s
    if ours is not None and theirs:
        ratio = ours / theirs
        verdict = (
            f"colocate / split tokens/s per GPU: **{ratio:.2f}x** (goal >= {GOAL}x: "
            f"{'met' if ratio >= GOAL else 'missed'})"
        )
    else:
        verdict = "colocate / split tokens/s per GPU: not measured (a layout did not run)"
    return "\n".join(
        [
            "# colocate on both GPUs vs split (trainer GPU 0, vLLM GPU 1)",
            "",
            f"- {facts.get('date', '?')}; {facts.get('device', '?')}; torch "
            f"{facts.get('torch', '?')}, vLLM {facts.get('vllm', '?')}",
            f"- same model and global batch (benchmarks/gpu_modes.py); medians over the steps "
            f"after the first {skip}; {GPUS} GPUs in both layouts",
            "",
            *rows,
            "",
            verdict,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--colocate", type=Path, required=True, help="gpu_modes --layout colocate")
    parser.add_argument("--split", type=Path, required=True, help="gpu_modes --layout split")
    parser.add_argument("--split-mode", default="shared_vllm")
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out")
    parser.add_argument("--window", type=int, default=3, help="steps averaged for the reward")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    colocate = read_layout("colocate x2", args.colocate, "colocate", args.skip, args.window)
    split = read_layout("split", args.split, args.split_mode, args.skip, args.window)
    facts = json.loads((args.colocate / "gpu_modes.json").read_text())["facts"]
    text = markdown(colocate, split, facts, args.skip)
    args.out.write_text(text)
    print(text)
    return 0 if colocate.tokens_per_gpu_s is not None else 1


if __name__ == "__main__":
    sys.exit(main())
