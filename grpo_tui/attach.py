"""``grpo-tui attach RUN``: follow a cluster run from a login node or its first node, and act.

Design: no network endpoint is added. The dashboard reads the run directory, which a
cluster run keeps on a file system every node and the login node share (``events.jsonl``,
``metrics.jsonl``, ``logs/``), and acts through the supervisor's Unix control socket
(``RUN/control.sock``: restart, stop, start, kill, mode switch, live edit, as the
dashboard that started the run does), which only works on the supervisor's own host. From
any other host ``attach`` runs itself again there through Slurm (``srun --jobid JOB
--overlap`` on the allocation's first node, ``--pty`` for the dashboard), so Slurm's own
authentication decides who may attach, and nothing listens beyond the node. When no
supervisor answers there (the run ended), the dashboard is read-only and says why.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_trainer.control import ControlError, SupervisorLink
from grpo_tui.headless import ALLOCATION_FILE
from grpo_tui.supervisor.control import CONTROL_SOCKET

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


ACTION_TIMEOUT = 900.0
"""Seconds an attached dashboard waits for an action: a restart or a mode switch waits
until the processes are ready again (a large vLLM takes minutes to load)."""
EDIT_TIMEOUT = 10.0
"""Seconds it waits for a live edit, which the supervisor answers at once."""


def control_socket(run_dir: Path) -> Path:
    """The supervisor's socket: ``run_dir/control.sock``, or where that links (a socket in
    the temp dir, the run directory's path being too long for one)."""
    path = run_dir / CONTROL_SOCKET
    return path.resolve() if path.is_symlink() else path


def supervisor_status(run_dir: Path) -> dict[str, str]:
    """``process -> state`` from the supervisor itself (control-socket ``status``).

    Raises ``ControlError`` when the supervisor does not answer, ``FileNotFoundError``
    when there is no socket (the run ended, or never started here).
    """
    path = control_socket(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"no control socket at {path} (the run is not running here)")
    link = SupervisorLink(str(path), process="grpo-tui attach")
    try:
        result = link.request("status", timeout=15)
    finally:
        link.close()
    return {str(k): str(v) for k, v in result["processes"].items()}


class AttachedControl:
    """The dashboard's actions on a supervisor it did not start, over its control socket.

    The same calls as :class:`grpo_tui.stack.stack.GrpoStack` (``restart``, ``stop``,
    ``start``, ``kill``, ``switch_mode``, ``edit``), each a control-socket request on one
    :class:`SupervisorLink`. The async ones wait in a daemon thread, so that a slow action
    never blocks the dashboard nor keeps it from exiting.
    """

    def __init__(self, run_dir: Path, link: SupervisorLink) -> None:
        self.run_dir = run_dir
        self.link = link

    @classmethod
    def connect(cls, run_dir: Path, timeout: float = 5.0) -> AttachedControl:
        """Connect and prove the supervisor answers (a ``status`` request).

        Raises ``FileNotFoundError`` without a socket, ``ControlError`` without an answer.
        """
        path = control_socket(run_dir)
        if not path.exists():
            raise FileNotFoundError(f"no control socket at {path}: the run has ended")
        link = SupervisorLink(str(path), process="grpo-tui attach")
        try:
            link.request("status", timeout=timeout)
        except ControlError:
            link.close()
            raise
        return cls(run_dir, link)

    async def restart(self, name: str) -> None:
        await self._ask("restart", name)

    async def stop(self, name: str) -> None:
        await self._ask("stop", name)

    async def start(self, name: str) -> None:
        await self._ask("start", name)

    async def kill(self, name: str) -> None:
        await self._ask("kill", name)

    async def switch_mode(self, mode: str) -> None:
        await self._ask("switch_mode", args={"mode": mode})

    def edit(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A live edit; raises ``ValueError`` with the supervisor's reason when refused."""
        self._require_connected()
        try:
            return self.link.request("edit", args=dict(values), timeout=EDIT_TIMEOUT)
        except ControlError as error:
            raise ValueError(error.reason) from None

    def close(self) -> None:
        self.link.close()

    def _require_connected(self) -> None:
        if not self.link.connected:
            raise ControlError(f"the supervisor no longer answers on {self.link.path}")

    async def _ask(
        self, action: str, process: str | None = None, args: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self._require_connected()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()

        def settle(result: dict[str, Any] | None, error: BaseException | None) -> None:
            if answer.done():
                return
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(result or {})

        def request() -> None:
            try:
                result = self.link.request(action, process, args, timeout=ACTION_TIMEOUT)
            except ControlError as error:
                outcome: tuple[dict[str, Any] | None, BaseException | None] = (None, error)
            else:
                outcome = (result, None)
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, *outcome)

        threading.Thread(target=request, name=f"attach-{action}", daemon=True).start()
        return await answer


def attach_control(run_dir: Path) -> tuple[AttachedControl | None, str]:
    """The control of a running supervisor, or None and why the dashboard is read-only."""
    try:
        return AttachedControl.connect(run_dir), ""
    except (FileNotFoundError, ControlError) as error:
        return None, f"read-only: {error}"
