"""Where each inference restart a trainer asked for went, from runs' ``events.jsonl``.

    python benchmarks/restart_phases.py LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Per run, over the restarts asked on the control socket (``lora_restart`` syncs, ``none``
with ``none_reload = "restart"``): request -> old server stopped (its shutdown), stopped ->
new one ready (a standby's remaining imports, then vLLM's engine start), request -> ready,
and how long before its adoption the standby had been spawned (vLLM's imports take
16-20 s on an H200 host: a younger one is still importing). A Markdown table on stdout,
one row per run, side by side.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from grpo_tui.supervisor.standby import STANDBY_ADOPTED

USAGE = "usage: python benchmarks/restart_phases.py LABEL=RUN_DIR [LABEL=RUN_DIR ...]"


def phases(run_dir: Path, process: str = "inference") -> dict[str, list[float]]:
    """Seconds of each phase of each asked-for restart of ``process`` in ``run_dir``."""
    found: dict[str, list[float]] = {"stop": [], "start": [], "total": [], "age": []}
    asked = stopped = None
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        kind = event["type"]
        if kind == "RequestReceived" and event.get("action") == "restart":
            asked, stopped = event["t"], None
        elif kind == "StateChanged" and event["process"] == process and asked is not None:
            if event["new"] == "stopped":
                stopped = event["t"]
                found["stop"].append(stopped - asked)
            elif event["new"] == "ready" and stopped is not None:
                found["start"].append(event["t"] - stopped)
                found["total"].append(event["t"] - asked)
                asked = stopped = None
        elif kind == "Notice" and event.get("code") == STANDBY_ADOPTED:
            found["age"].append(float(event["data"]["waited_s"]))
    return found


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} / {max(values):.1f}"


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print(USAGE, file=sys.stderr)
        return 2
    print(
        "| run | restarts | request -> stopped s | stopped -> ready s | request -> ready s "
        "| standby age at adoption s |\n|---|---|---|---|---|---|"
    )
    for arg in argv:
        label, _, path = arg.partition("=")
        found = phases(Path(path))
        print(
            f"| {label} | {len(found['total'])} | {cell(found['stop'])} | {cell(found['start'])}"
            f" | {cell(found['total'])} | {cell(found['age'])} |"
        )
    print("\n(median / max; the standby's age is in adoption notices since 2026-11-26 23:00)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
