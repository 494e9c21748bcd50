"""A sweep's cells as Slurm batch jobs: submitted, watched, cancelled by their own ids.

Each cell is submitted with the batch script ``grpo-tui sbatch`` writes (one allocation of
the profile's ``[cluster]`` size running ``grpo-tui run`` on its first node), its output
appended to the sweep's ``console/<cell>.log``. One ``squeue`` call per period tells the
state of every job the sweep watches; an ended job's exit code comes from ``scontrol show
job`` while the controller remembers it (``MinJobAge``), else from ``sacct`` where
accounting is on. A stop cancels the sweep's own job ids (``scancel JOBID``), never by name.
The jobs do not depend on the sweep process: a killed sweep leaves them to Slurm, and the
next one watches them again.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.plan.sbatch import batch_script, submit

POLL_S = 2.0
"""Seconds between ``squeue`` calls (one call for all watched jobs)."""

ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
"""Job states after which a job runs no more (``squeue --states=all`` may still list it)."""

UNKNOWN = "UNKNOWN"
UNANSWERED = "UNANSWERED"
"""What a watched job reads as while ``squeue`` fails (a busy controller): asked again later."""


@dataclass(frozen=True)
class JobEnd:
    """How a job ended: Slurm's state and the batch script's exit code (-1 when unknown)."""

    state: str
    exit_code: int

    @property
    def final(self) -> bool:
        """Ended, or forgotten by Slurm (then it is no more in the queue either)."""
        return self.state in ENDED or self.state == UNKNOWN

    @property
    def completed(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == 0


def _slurm(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; a missing command or a timeout reads as a failed one."""
    try:
        return subprocess.run(
            list(command), capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(list(command), 1, "", str(error))


def submit_cell(
    profile: Path, run_dir: Path, console: Path, name: str, options: Sequence[str]
) -> str:
    """Submit one cell as ``grpo-tui sbatch`` would (the same script); returns the job id.

    ``options`` go to ``sbatch`` after the sweep's own (``--output`` to the cell's console
    log, appended across attempts, and the job name), so they win over both.
    """
    plan = build_plan(load_profile(profile), run_dir=run_dir)
    script = batch_script(plan, profile, mode=None, cwd=Path.cwd())
    own = [f"--output={console}", "--open-mode=append", f"--job-name={name}"]
    return submit(plan, script, [*own, *options])[1]


def job_states(jobs: Sequence[str]) -> dict[str, str]:
    """Slurm's state of each job the controller still knows; forgotten ones are absent."""
    if not jobs:
        return {}
    done = _slurm(["squeue", "-h", "--states=all", f"--jobs={','.join(jobs)}", "-o", "%i|%T"])
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # none of them is known any more
            return {}
        raise RuntimeError(f"squeue: {done.stderr.strip() or done.returncode}")
    states = {}
    for line in done.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job in jobs:
            states[job] = state
    return states


def _exit_code(text: str) -> int:
    """Slurm's ``CODE:SIGNAL`` as one exit status (128 + signal for a killed script)."""
    code, _, signal = text.partition(":")
    try:
        return 128 + int(signal) if signal and int(signal) else int(code)
    except ValueError:
        return -1


def job_end(job: str) -> JobEnd:
    """How an ended job ended: ``scontrol show job``, else ``sacct``, else unknown."""
    shown = _slurm(["scontrol", "show", "job", "-o", job])
    if shown.returncode == 0:
        fields = dict(part.split("=", 1) for part in shown.stdout.split() if "=" in part)
        if "JobState" in fields:
            return JobEnd(fields["JobState"], _exit_code(fields.get("ExitCode", "")))
    acct = _slurm(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode"])
    rows = [line.split("|") for line in acct.stdout.splitlines() if "|" in line]
    if acct.returncode == 0 and rows:
        state, code = rows[0][0], rows[0][1]
        return JobEnd(state.split()[0] if state else UNKNOWN, _exit_code(code))
    return JobEnd(UNKNOWN, -1)


def cancel(jobs: Sequence[str]) -> None:
    """``scancel`` these job ids (and nothing else)."""
    if jobs:
        _slurm(["scancel", *jobs])


class SlurmJobs:
    """The sweep's jobs: submission with its ``sbatch`` options, one shared ``squeue`` poll."""

    def __init__(self, options: Sequence[str] = (), *, period: float = POLL_S) -> None:
        self.options = list(options)
        self.period = period
        self.watched: set[str] = set()
        self._states: dict[str, str] = {}
        self._polled: frozenset[str] = frozenset()
        self._polled_at = -math.inf
        self._lock = asyncio.Lock()

    async def submit(self, profile: Path, run_dir: Path, console: Path, name: str) -> str:
        job = await asyncio.to_thread(submit_cell, profile, run_dir, console, name, self.options)
        self.watched.add(job)
        return job

    async def state(self, job: str) -> str | None:
        """The job's state as of the last poll (at most ``period`` old); None once forgotten."""
        async with self._lock:
            if job not in self._polled or time.monotonic() - self._polled_at >= self.period:
                self._polled = frozenset(self.watched | {job})
                try:
                    self._states = await asyncio.to_thread(job_states, sorted(self._polled))
                except RuntimeError:
                    self._states = dict.fromkeys(self._polled, UNANSWERED)
                self._polled_at = time.monotonic()
        return self._states.get(job)

    async def wait(self, job: str, on_running: Callable[[], None]) -> JobEnd:
        """Watch ``job`` until it ends; ``on_running`` is called once when it starts running."""
        self.watched.add(job)
        running = False
        try:
            while True:
                state = await self.state(job)
                if state is None or state in ENDED:
                    end = await asyncio.to_thread(job_end, job)
                    if end.final:
                        return end
                if state == "RUNNING" and not running:
                    running = True
                    on_running()
                await asyncio.sleep(self.period)
        finally:
            self.watched.discard(job)

    def cancel_all(self) -> list[str]:
        """Cancel every job the sweep watches, by id; returns those ids."""
        jobs = sorted(self.watched)
        cancel(jobs)
        return jobs
