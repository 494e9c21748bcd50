"""Runs a sweep's unfinished cells, up to N at a time, each as a real ``grpo-tui run``.

Each cell is its own supervised run (``python -m grpo_tui run PROFILE --run-dir DIR``) in
its own session, so a Ctrl-C in the terminal reaches the sweep only, which then asks every
running cell for an ordered shutdown (SIGTERM). If the sweep itself dies, SIGKILL
included, the kernel sends each cell SIGTERM (``PR_SET_PDEATHSIG``, set in the child
before exec), and each cell's supervisor ends its processes as on any SIGTERM; its own
watchdog covers the rest. The journal is appended before and after each cell, so a
restarted sweep knows what finished.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

from grpo_tui.profile import Profile
from grpo_tui.sweep.grid import Cell, apply_overrides, describe, write_profile
from grpo_tui.sweep.resources import Lease, Resources, gpus_needed, leased_profile
from grpo_tui.sweep.store import SweepDir, SweepRecord

PR_SET_PDEATHSIG = 1
EXIT_INTERRUPTED = 130


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class SweepRunner:
    """Schedules the cells that are not done yet; :meth:`run` returns the sweep's exit code."""

    def __init__(
        self,
        sweep: SweepDir,
        record: SweepRecord,
        profile: Profile,
        *,
        parallel: int,
        gpus: list[str],
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.sweep = sweep
        self.record = record
        self.profile = profile
        self.parallel = parallel
        self.per_cell_gpus = gpus_needed(profile.data) if gpus else 0
        self.resources = Resources(gpus=list(gpus))
        self.log = log
        self.stopping = False
        self._procs: dict[str, asyncio.subprocess.Process] = {}

    def pending(self) -> list[Cell]:
        """Cells to run, in sweep order: every cell not journaled as done."""
        statuses = self.sweep.statuses()
        return [s.cell for s in statuses.values() if s.state != "done"]

    async def run(self) -> int:
        me = psutil.Process()
        self.sweep.append("sweep_start", pid=me.pid, create_time=me.create_time())
        queue = self.pending()
        done = len(self.record.cells) - len(queue)
        self.log(f"{len(self.record.cells)} cells, {done} done before, {len(queue)} to run")
        running: set[asyncio.Task[int]] = set()
        failed = 0
        while (queue or running) and not (self.stopping and not running):
            while (
                queue
                and not self.stopping
                and len(running) < self.parallel
                and self.resources.can_lease(self.per_cell_gpus)
            ):
                running.add(asyncio.create_task(self._run_cell(queue.pop(0))))
            finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            failed += sum(1 for task in finished if task.result() != 0)
        self.sweep.append("sweep_end", stopped=self.stopping)
        if self.stopping:
            return EXIT_INTERRUPTED
        return 1 if failed else 0

    def stop(self) -> None:
        """Start no more cells and ask the running ones for an ordered shutdown."""
        if self.stopping:
            return
        self.stopping = True
        self.log(f"stopping: SIGTERM to {len(self._procs)} running cell(s)")
        for proc in self._procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)

    async def _run_cell(self, cell: Cell) -> int:
        data = apply_overrides(self.profile.data, cell.overrides)
        lease = self.resources.lease(data, self.per_cell_gpus)
        try:
            return await self._launch(cell, data, lease)
        finally:
            self.resources.release(lease)

    async def _launch(self, cell: Cell, data: dict[str, Any], lease: Lease) -> int:
        sweep = self.sweep
        profile = sweep.profile_path(cell.id)
        profile.parent.mkdir(parents=True, exist_ok=True)
        header = f"Cell {cell.id} of the sweep in {sweep.path}: {describe(cell)}"
        write_profile(profile, leased_profile(data, lease), header=header)
        attempt = self._set_aside(cell.id)
        env = dict(os.environ)
        if lease.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(lease.gpus)
        console = sweep.console_path(cell.id)
        console.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "grpo_tui", "run", str(profile)]
        command += ["--run-dir", str(sweep.run_dir(cell.id))]
        started = time.monotonic()
        with console.open("ab") as output:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        self._procs[cell.id] = proc
        sweep.append(
            "cell_start",
            cell=cell.id,
            attempt=attempt,
            pid=proc.pid,
            ports=lease.ports,
            gpus=lease.gpus,
        )
        ports = " ".join(f"{k}={v}" for k, v in lease.ports.items())
        self.log(f"{cell.id} started (pid {proc.pid}) {describe(cell)} {ports}".rstrip())
        try:
            code = await proc.wait()
        finally:
            self._procs.pop(cell.id, None)
        sweep.append("cell_end", cell=cell.id, attempt=attempt, exit_code=code)
        outcome = "done" if code == 0 else f"failed (exit {code}, see {console})"
        self.log(f"{cell.id} {outcome} after {time.monotonic() - started:.0f}s")
        return code

    def _set_aside(self, cell_id: str) -> int:
        """Move an unfinished attempt's run directory to ``attempts/``; the attempt number."""
        attempt = 1 + sum(
            1
            for e in self.sweep.journal()
            if e.get("event") == "cell_start" and e.get("cell") == cell_id
        )
        run_dir = self.sweep.run_dir(cell_id)
        if run_dir.exists():
            target = self.sweep.path / "attempts" / f"{cell_id}-{attempt - 1}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(run_dir, target)
        return attempt


def run_sweep(runner: SweepRunner) -> int:
    """Run ``runner`` to the end in a new event loop; SIGINT / SIGTERM stop it in order."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop)
        return await runner.run()

    return asyncio.run(main())
