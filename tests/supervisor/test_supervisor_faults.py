"""Faults the supervisor must see at once and say plainly: a leader that dies while its
descendants hold its output, a command that cannot start, a needed process failing for good."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from conftest import child, spec

from grpo_tui.supervisor.events import Restarting, State, StateChanged
from grpo_tui.supervisor.spec import RestartPolicy


def alive(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            continue
    return left


@pytest.mark.timeout(30)  # on main (0a632e5) this waited forever: the pipe stayed open
async def test_a_leader_killed_while_descendants_hold_its_output_restarts_at_once(
    supervise, tmp_path
) -> None:
    """As vLLM's API server SIGKILLed with its engine core alive (references.md section 8):
    the exit is seen on the leader's pid, its group and its setsid descendant are ended,
    and the restart begins well within a second, not after liveness timeouts."""
    pidfile = tmp_path / "holder.pids"
    policy = RestartPolicy(policy="always", backoff_base=0.05, max_restarts=2)
    ready = {"kind": "log_line", "pattern": "holder ready"}
    h = supervise([spec("holder", child("holder.py", pidfile), readiness=ready, restart=policy)])
    await h.state("holder", State.READY)
    family = [int(line) for line in pidfile.read_text().split()]
    assert len(alive(family)) == 3
    pidfile.unlink()
    killed = time.time()
    os.kill(family[0], signal.SIGKILL)

    restarting = await h.until(lambda e: isinstance(e, Restarting), timeout=5)
    respawned = await h.until(
        lambda e: (
            isinstance(e, StateChanged)
            and e.new == State.STARTING
            and e.pid not in (None, family[0])
        ),
        timeout=5,
    )
    assert restarting.reason == "killed by SIGKILL"
    assert respawned.t - killed < 1.0, f"restarted {respawned.t - killed:.2f} s after the kill"
    assert alive(family) == [], "the grandchildren holding the output outlived their leader"
