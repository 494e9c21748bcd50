"""``grpo-tui attach RUN``: follow a cluster run from a login node or its first node.

Design: no network endpoint is added. The dashboard reads the run directory, which a
cluster run keeps on a file system every node and the login node share (``events.jsonl``,
``metrics.jsonl``, ``logs/``), and asks the supervisor through its Unix control socket
(``RUN/control.sock``), which only works on the supervisor's own host. From any other host
``attach`` runs itself again there through Slurm (``srun --jobid JOB --overlap`` on the
allocation's first node, ``--pty`` for the dashboard), so Slurm's own authentication
decides who may attach, and nothing listens beyond the node.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from grpo_tui.headless import ALLOCATION_FILE

HOPPED_ENV = "GRPO_TUI_ATTACHED"
"""Set on the ``srun`` hop, so that the second ``attach`` never hops again."""


def read_allocation(run_dir: Path) -> dict[str, Any] | None:
    """What ``grpo-tui run`` recorded of its Slurm job (None: no such file yet)."""
    try:
        record = json.loads((run_dir / ALLOCATION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def on_supervisor_host(record: dict[str, Any]) -> bool:
    return socket.gethostname() == record.get("supervisor_host") or HOPPED_ENV in os.environ


def srun_hop(record: dict[str, Any], run_dir: Path, args: list[str], *, pty: bool) -> list[str]:
    """``attach`` again on the supervisor's node, inside the job, through ``srun``."""
    hop = [
        "srun",
        f"--jobid={record['job_id']}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={record['supervisor_node']}",
        f"--export=ALL,{HOPPED_ENV}=1",
    ]
    if pty:
        hop.append("--pty")
    return [*hop, sys.executable, "-m", "grpo_tui", "attach", str(run_dir), *args]


def supervisor_status(run_dir: Path) -> dict[str, str]:
    """``process -> state`` from the supervisor itself (control-socket ``status``).

    Raises ``ControlError`` when the supervisor does not answer, ``FileNotFoundError``
    when there is no socket (the run ended, or never started here).
    """
    from grpo_trainer.control import SupervisorLink

    path = run_dir / "control.sock"
    if not path.exists():
        raise FileNotFoundError(f"no control socket at {path} (the run is not running here)")
    link = SupervisorLink(str(path), process="grpo-tui attach")
    try:
        result = link.request("status", timeout=15)
    finally:
        link.close()
    return {str(k): str(v) for k, v in result["processes"].items()}
