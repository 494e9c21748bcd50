"""Which process held which GPU in a finished run: the plan next to what NVML saw.

Reads ``RUN/profile.toml`` (the plan: ``[trainer] gpus``, ``[inference] gpus``) and the
dashboard's ``GpuSample`` events in ``RUN/events.jsonl`` (NVML: per GPU, the supervised
processes pinned there or holding memory there, memory used, utilisation), and prints one
table: per GPU, the planned roles, the holders seen, peak memory and peak utilisation.
Exits 1 when a planned role was never seen on its GPU or a role was seen on a GPU it was
not planned on, 2 when the run has no GPU samples (no NVML: a CPU run).

    python benchmarks/gpu_holders.py RUN_DIR [--out FILE.md]

On the GPU machine, after any ``grpo-tui run`` with ``gpus`` keys (e.g. the fsdp2 layout
of ``gpu_modes.py``), to check the dashboard's GPU table against the plan.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan


@dataclass
class Seen:
    """What NVML showed of one GPU over the run."""

    name: str = "?"
    holders: set[str] = field(default_factory=set)
    memory_gb: float = 0.0
    util: float = 0.0


def observed(run_dir: Path) -> dict[int, Seen]:
    """Per GPU index: holders seen, peak memory, peak utilisation, its name."""
    seen: dict[int, Seen] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") != "GpuSample":
            continue
        gpu = seen.setdefault(int(event["index"]), Seen())
        gpu.name = str(event["name"])
        gpu.holders |= set(event.get("holders", ()))
        gpu.memory_gb = max(gpu.memory_gb, event["memory_used_bytes"] / 1e9)
        gpu.util = max(gpu.util, float(event["utilization_percent"]))
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = parser.parse_args()
    plan = build_plan(load_profile(args.run_dir / "profile.toml"), args.run_dir)
    planned = plan.roles.gpu_plan.holders()
    seen = observed(args.run_dir)
    if not seen:
        print(f"{args.run_dir}: no GpuSample events (no NVML during the run)")
        return 2
    rows = [
        "| GPU | planned | seen by NVML | peak memory GB | peak util % | ok |",
        "|---|---|---|---|---|---|",
    ]
    ok = True
    for index in sorted(set(planned) | set(seen)):
        want = set(planned.get(index, ()))
        gpu = seen.get(index, Seen())
        good = gpu.holders & {"trainer", "inference"} == want
        ok &= good
        rows.append(
            f"| {index} ({gpu.name}) | {', '.join(sorted(want)) or '-'} | "
            f"{', '.join(sorted(gpu.holders)) or '-'} | {gpu.memory_gb:.1f} | {gpu.util:.0f} | "
            f"{'yes' if good else 'NO'} |"
        )
    table = "\n".join(rows)
    print(table)
    if args.out:
        args.out.write_text(f"# GPU holders of {args.run_dir.name}\n\n{table}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
