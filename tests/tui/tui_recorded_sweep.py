"""A deterministic sweep directory (fixed times, fixed metrics) for the sweep screen's
snapshots: three cells of six steps, all done, as ``grpo-tui sweep`` leaves them."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_tui.sweep.store import AxisRecord, CellRecord, SweepDir, SweepRecord

T0 = 1_800_000_000.0
SCALES = (0.3, 0.9, 0.6)
STEPS = 6


def recorded_sweep(root: Path) -> SweepDir:
    """``root/sweep``: ``sweep.json``, its journal and each cell's ``metrics.jsonl``."""
    sweep = SweepDir(root / "sweep")
    sweep.path.mkdir(parents=True)
    cells = [
        CellRecord(id=f"{i}-SCALE{scale}", overrides={"env.scale": scale})
        for i, scale in enumerate(SCALES)
    ]
    record = SweepRecord(
        profile="profiles/quickstart.toml",
        profile_sha256="0" * 64,
        zip=False,
        axes=[AxisRecord(key="env.scale", values=list(SCALES), texts=[str(s) for s in SCALES])],
        cells=cells,
    )
    sweep.record_path.write_text(record.model_dump_json(indent=2))
    journal = [{"t": T0, "event": "sweep_start", "pid": 0, "create_time": 0.0}]
    for i, cell in enumerate(cells):
        start = T0 + 1 + i
        journal.append({"t": start, "event": "cell_start", "cell": cell.id})
        run = sweep.run_dir(cell.id)
        run.mkdir()
        scale = SCALES[i]
        lines = [
            {
                "t": start + 2 * step,
                "process": "trainer",
                "step": step,
                "data": {
                    "reward/mean": scale * step / STEPS,
                    "kl": 0.01 * step * scale,
                    "loss": 0.5 / step,
                    "training_steps": STEPS,
                },
            }
            for step in range(1, STEPS + 1)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        journal.append(
            {"t": start + 2 * STEPS + 1, "event": "cell_end", "cell": cell.id, "exit_code": 0}
        )
    sweep.journal_path.write_text("".join(json.dumps(x) + "\n" for x in journal))
    return sweep
