"""Runs a sweep's unfinished cells, up to N at a time, each as a real ``grpo-tui run``.

Each cell is its own supervised run (``python -m grpo_tui run PROFILE --run-dir DIR``) in
its own session, so a Ctrl-C in the terminal reaches the sweep only, which then asks every
running cell for an ordered shutdown (SIGTERM). If the sweep itself dies, SIGKILL
included, the kernel sends each cell SIGTERM (``PR_SET_PDEATHSIG``, set in the child
before exec), and each cell's supervisor ends its processes as on any SIGTERM; its own
watchdog covers the rest. The journal is appended before and after each cell, so a
restarted sweep knows what finished.

With one inference server for the whole sweep (``inference_url``: a server already kept;
``server``: one the sweep keeps itself, :mod:`grpo_tui.sweep.kept`), the cells run one
after another, each attached to it (``--inference-url``).

On Slurm (a profile with ``[cluster] engine = "slurm"``) each cell is one batch job
instead (:mod:`grpo_tui.sweep.slurm_jobs`): up to N jobs submitted at once, watched through
``squeue``; a stop cancels the sweep's own job ids. Jobs outlive a killed sweep, so a
restarted one first asks Slurm about the jobs it journaled: a job still queued or running
is watched again, not resubmitted; one that ended meanwhile gets its end journaled.
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

from grpo_tui.plan.profile import Profile
from grpo_tui.sweep.grid import Cell, apply_overrides, describe, write_profile
from grpo_tui.sweep.kept import KeptServer
from grpo_tui.sweep.resources import Lease, Resources, gpus_needed, leased_profile
from grpo_tui.sweep.slurm_jobs import ENDED, JobEnd, SlurmJobs, cancel, job_end, job_states
from grpo_tui.sweep.store import CellStatus, SweepDir, SweepRecord

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
        slurm: SlurmJobs | None = None,
        inference_url: str | None = None,
        server: KeptServer | None = None,
    ) -> None:
        self.sweep = sweep
        self.record = record
        self.profile = profile
        self.parallel = parallel
        self.per_cell_gpus = gpus_needed(profile.data) if gpus else 0
        self.resources = Resources(gpus=list(gpus))
        self.log = log
        self.slurm = slurm
        self.inference_url = server.url if server is not None else inference_url
        """The server every cell attaches to (one cell at a time), if any."""
        self.server = server
        self.stopping = False
        self._procs: dict[str, asyncio.subprocess.Process] = {}

    def pending(self) -> list[Cell]:
        """Cells to run, in sweep order: every cell not journaled as done."""
        statuses = self.sweep.statuses()
        return [s.cell for s in statuses.values() if s.state != "done"]

    async def run(self) -> int:
        """Every pending cell (with the kept server, if any, around them); the exit code."""
        if self.server is None:
            return await self._run_cells()
        try:
            await self.server.start(preexec=_die_with_parent())
        except RuntimeError as error:
            self.log(f"the kept server did not start: {error}")
            return 1
        try:
            return await self._run_cells()
        finally:
            await self.server.stop()

    async def _run_cells(self) -> int:
        me = psutil.Process()
        self.sweep.append("sweep_start", pid=me.pid, create_time=me.create_time())
        watched = await self._reconcile() if self.slurm is not None else []
        running = {asyncio.create_task(self._watch_again(status)) for status in watched}
        again = {status.cell.id for status in watched}
        queue = [cell for cell in self.pending() if cell.id not in again]
        done = len(self.record.cells) - len(queue) - len(again)
        line = f"{len(self.record.cells)} cells, {done} done before, {len(queue)} to run"
        if watched:
            line += f", {len(watched)} still in Slurm's queue (watched again, not resubmitted)"
        self.log(line)
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
        if self.slurm is not None:
            jobs = self.slurm.cancel_all()
            self.log(f"stopping: scancel {' '.join(jobs) or '(no job)'}")
            return
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
        if self.slurm is not None:
            return await self._submit(cell, attempt, lease)
        env = dict(os.environ)
        if lease.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(lease.gpus)
        console = sweep.console_path(cell.id)
        console.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "grpo_tui", "run", str(profile)]
        command += ["--run-dir", str(sweep.run_dir(cell.id))]
        if self.inference_url is not None:
            command += ["--inference-url", self.inference_url]
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

    async def _submit(self, cell: Cell, attempt: int, lease: Lease) -> int:
        """Submit the cell as a batch job and watch it to its end; its exit code."""
        assert self.slurm is not None
        sweep = self.sweep
        console = sweep.console_path(cell.id)
        console.parent.mkdir(parents=True, exist_ok=True)
        name = f"grpo-sweep.{sweep.path.name}.{cell.id}"
        try:
            job = await self.slurm.submit(
                sweep.profile_path(cell.id), sweep.run_dir(cell.id), console, name
            )
        except (OSError, RuntimeError) as error:
            with console.open("a", encoding="utf-8") as output:
                output.write(f"sbatch refused the cell: {error}\n")
            sweep.append("cell_end", cell=cell.id, attempt=attempt, exit_code=-1)
            self.log(f"{cell.id} failed: sbatch: {error}")
            return -1
        sweep.append("cell_submit", cell=cell.id, attempt=attempt, job=job, ports=lease.ports)
        self.log(f"{cell.id} submitted as job {job} {describe(cell)}")
        if self.stopping:  # the stop came while sbatch was submitting it
            cancel([job])
        return await self._watch(cell, attempt, job)

    async def _watch(self, cell: Cell, attempt: int, job: str, *, journaled: bool = False) -> int:
        """Watch the job to its end; ``journaled``: its start is in the journal already."""
        assert self.slurm is not None
        started = time.monotonic()

        def running() -> None:
            if not journaled:
                self.sweep.append("cell_start", cell=cell.id, attempt=attempt, job=job)
                self.log(f"{cell.id} running (job {job})")

        end = await self.slurm.wait(job, on_running=running)
        self._journal_end(cell.id, attempt, job, end)
        self.log(f"{cell.id} job {job} {end.state} after {time.monotonic() - started:.0f}s")
        return 0 if end.completed else end.exit_code or 1

    async def _watch_again(self, status: CellStatus) -> int:
        """Watch a job an earlier sweep submitted, holding the ports its profile took."""
        assert status.job is not None
        ports = set(status.ports.values()) - self.resources.held_ports
        self.resources.held_ports |= ports
        try:
            running = status.state == "running"
            return await self._watch(status.cell, status.attempts, status.job, journaled=running)
        finally:
            self.resources.held_ports -= ports

    async def _reconcile(self) -> list[CellStatus]:
        """The cells whose journaled job Slurm still queues or runs; the others' ends journaled."""
        open_jobs = [
            s for s in self.sweep.statuses().values() if s.job and s.state in ("pending", "running")
        ]
        states = await asyncio.to_thread(job_states, [s.job for s in open_jobs if s.job])
        live = []
        for status in open_jobs:
            assert status.job is not None
            state = states.get(status.job)
            end = None if state and state not in ENDED else job_end(status.job)
            if end is None or not end.final:
                live.append(status)
            else:
                self._journal_end(status.cell.id, status.attempts, status.job, end)
        return live

    def _journal_end(self, cell_id: str, attempt: int, job: str, end: JobEnd) -> None:
        self.sweep.append(
            "cell_end",
            cell=cell_id,
            attempt=attempt,
            job=job,
            exit_code=end.exit_code,
            slurm_state=end.state,
        )

    def _set_aside(self, cell_id: str) -> int:
        """Move an unfinished attempt's run directory to ``attempts/``; the attempt number."""
        attempt = 1 + self.sweep.statuses()[cell_id].attempts
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
