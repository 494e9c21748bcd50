"""Slurm job steps of a run: find them by name, cancel them by id, wait until they are gone.

A role that runs as ``srun --job-name=NAME ...`` is one job step. Its tasks are children of
``slurmstepd`` on their nodes, not of ``srun``, so ending ``srun``'s process group does not
reach them: Slurm does (it signals every task when ``srun`` forwards a signal or dies, and
``scancel JOB.STEP`` cancels the step on every node). The supervisor calls this when it
stops such a process; the watchdog calls it when the supervisor is gone. Only steps whose
name the run gave are touched, each by its id, within the current job when there is one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Collection

JOB_ENV = "SLURM_JOB_ID"
GONE_WAIT = 45.0
"""Seconds to wait for cancelled steps to leave ``squeue`` (Slurm's KillWait is 30 s)."""


def running_steps(names: Collection[str]) -> list[str]:
    """Ids (``JOB.STEP``) of this user's live job steps named in ``names``."""
    if not names or shutil.which("squeue") is None:
        return []
    command = ["squeue", "-h", "--steps", "-o", "%i %j"]
    job = os.environ.get(JOB_ENV)
    command += ["--jobs", job] if job else ["--me"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in done.stdout.splitlines():
        parts = line.split(maxsplit=1)
        if len(parts) == 2 and parts[1] in names:
            found.append(parts[0])
    return found


def job_trouble() -> str | None:
    """Why the current job can run no more steps (a node down or drained, the job gone),
    in words, or None when it can (or when this is not a Slurm job).

    Asked when a step ends unasked: a lost node is not worth a restart, it ends the run.
    A node that failed may already be back (``ReturnToService``), so the job's own state
    (``NODE_FAIL``) counts as much as the node's.
    """
    job = os.environ.get(JOB_ENV)
    if not job or shutil.which("scontrol") is None:
        return None
    try:
        fields = dict(
            part.split("=", 1)
            for part in _output(["scontrol", "-o", "show", "job", job]).split()
            if "=" in part
        )
        state, nodelist = fields.get("JobState", ""), fields.get("NodeList", "")
        names = _output(["scontrol", "show", "hostnames", nodelist]).split() if nodelist else []
        nodes = _output(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E"])
    except (OSError, subprocess.SubprocessError):
        return None
    for line in nodes.splitlines() if names else []:
        name, _, rest = line.partition("|")
        node_state, _, why = rest.partition("|")
        if any(bad in node_state for bad in ("down", "drain", "fail", "not_responding")):
            node_state = node_state.rstrip("*")
            return f"node {name} of job {job} is {node_state} ({why.strip() or 'no reason'})"
    if state and state != "RUNNING":  # the supervisor runs inside the job: it must run
        return f"Slurm job {job} is {state} ({fields.get('Reason', '')})"
    return None


def _output(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout


def signal_steps(step_ids: Collection[str], sig: int) -> None:
    """Send ``sig`` to every task of each step (``scancel --signal``), on every node.

    The way to stop a step gracefully: ``srun`` itself forwards most signals, but turns a
    SIGTERM into a forced termination (SIGKILL to the tasks), which would cost a process
    the work it saves as it stops (a last checkpoint).
    """
    if step_ids:
        command = ["scancel", "--quiet", f"--signal={int(sig)}", *step_ids]
        subprocess.run(command, capture_output=True, timeout=30)


def cancel(step_ids: Collection[str]) -> None:
    """``scancel`` each step by id (SIGTERM to every task, SIGKILL after KillWait)."""
    if step_ids:
        subprocess.run(["scancel", "--quiet", *step_ids], capture_output=True, timeout=30)


def end_steps(names: Collection[str], *, wait: float = GONE_WAIT) -> list[str]:
    """Cancel the live steps named in ``names``; return those still listed after ``wait`` s.

    Blocking (it polls ``squeue``); call it from a thread in async code.
    """
    steps = running_steps(names)
    if not steps:
        return []
    cancel(steps)
    deadline = time.monotonic() + wait
    while (left := running_steps(names)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
