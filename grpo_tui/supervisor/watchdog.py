"""The orphan guard: ends every process of a run once its supervisor is gone, however it died.

The supervisor starts this first (``python -m grpo_tui.supervisor.watchdog --fd N --run-id
ID``) in its own session, handing it the read end of a pipe whose write end only the
supervisor holds (Python fds are not inheritable, so no child holds a copy). The kernel
closes that write end when the supervisor exits, SIGKILL included, and the watchdog reads
EOF. It then ends everything it knows of: every process whose environment carries the
run's ``GRPO_TUI_RUN_ID`` (grandchildren and ``setsid`` daemons inherit it), every process
group the supervisor announced (``pgid N`` lines, withdrawn by ``gone N`` once the group is
confirmed empty, so a reused id is never hit) and every descendant pid it announced
(``pid N CREATE_TIME`` lines, for children that scrub their environment), and every Slurm
job step of the run (``step NAME`` lines: its tasks on other nodes are out of reach of any
signal from here, so the steps of those names are ``scancel``led by id). SIGTERM first,
SIGKILL after ``--grace`` seconds.

Why not ``PR_SET_PDEATHSIG``: it reaches only direct children, and fires on the death of the
spawning *thread*. Why not a sweep at next start: the GPU stays held until then.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import psutil

from grpo_tui.supervisor.steps import cancel, end_steps, running_steps
from grpo_tui.supervisor.tree import alive, group_members, tagged, terminate_all


def _read_announcements(fd: int) -> tuple[set[int], dict[int, float], set[str]]:
    """Read until EOF; the process groups, pids and job-step names the supervisor announced."""
    pgids: set[int] = set()
    pids: dict[int, float] = {}
    steps: set[str] = set()
    buffer = b""
    while chunk := os.read(fd, 65536):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0] == b"pgid":
                pgids.add(int(parts[1]))
            elif len(parts) == 2 and parts[0] == b"gone":
                pgids.discard(int(parts[1]))
            elif len(parts) == 3 and parts[0] == b"pid":
                pids[int(parts[1])] = float(parts[2])
            elif len(parts) == 2 and parts[0] == b"step":
                steps.add(parts[1].decode())
    return pgids, pids, steps


def _announced(pids: dict[int, float]) -> list[psutil.Process]:
    """Announced pids still held by the same process (same create time: no pid reuse)."""
    found = []
    for pid, created in pids.items():
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="read end of the lifeline pipe")
    parser.add_argument("--run-id", required=True, help="value of GRPO_TUI_RUN_ID to sweep")
    parser.add_argument("--grace", type=float, default=2.0, help="seconds from TERM to KILL")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    pgids, pids, steps = _read_announcements(args.fd)
    cancel(running_steps(steps))
    procs = {p.pid: p for p in _announced(pids)}
    procs.update({p.pid: p for p in tagged(args.run_id)})
    for pgid in pgids:
        procs.update({p.pid: p for p in group_members(pgid)})
    procs.pop(os.getpid(), None)
    terminate_all(alive(procs.values()), pgids, grace=args.grace)
    left = end_steps(steps)
    if left:
        print(f"job steps still listed after scancel: {' '.join(left)}", file=sys.stderr)


if __name__ == "__main__":
    main()
