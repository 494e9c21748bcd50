"""Faults the supervisor must see at once and say plainly: a leader that dies while its
descendants hold its output, a command that cannot start, a needed process failing for good."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
from conftest import alive, child, spec

from grpo_tui.supervisor.events import NeedLost, NeedRegained, Restarting, State, StateChanged
from grpo_tui.supervisor.process import ChildProcess, SpawnError
from grpo_tui.supervisor.spec import Need, ProcessSpec, RestartPolicy


@pytest.mark.timeout(30)  # on main (0a632e5) this waited forever: the pipe stayed open
async def test_a_leader_killed_while_descendants_hold_its_output_restarts_at_once(
    supervise, tmp_path
) -> None:
    """As vLLM's API server SIGKILLed with its engine core alive (references.md section 8):
    the exit is seen on the leader's pid (the restart's reason is the SIGKILL, not a
    liveness probe; on the old code the pipe its grandchildren hold kept it waiting for
    good), and its group and its setsid descendant are ended. That the restart then comes
    as soon as the backoff is over: ``test_lifecycle_machine.py``, on a fake clock."""
    pidfile = tmp_path / "holder.pids"
    policy = RestartPolicy(policy="always", backoff_base=0.05, max_restarts=2)
    ready = {"kind": "log_line", "pattern": "holder ready"}
    h = supervise([spec("holder", child("holder.py", pidfile), readiness=ready, restart=policy)])
    await h.state("holder", State.READY)
    family = [int(line) for line in pidfile.read_text().split()]
    assert len(alive(family)) == 3
    pidfile.unlink()
    os.kill(family[0], signal.SIGKILL)

    restarting = await h.until(lambda e: isinstance(e, Restarting))
    await h.until(
        lambda e: (
            isinstance(e, StateChanged)
            and e.new == State.STARTING
            and e.pid not in (None, family[0])
        )
    )
    assert restarting.reason == "killed by SIGKILL"
    assert alive(family) == [], "the grandchildren holding the output outlived their leader"


WORKER = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    print('checkpoint written', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('working', flush=True)\n"
    "while True: time.sleep(0.05)\n",
]
BROKEN = [sys.executable, "-c", "import no_such_mod"]


async def test_a_spawn_error_that_may_pass_backs_off_and_is_never_failed(
    supervise, monkeypatch
) -> None:
    """Issue 35: a spawn error that may pass (out of memory or processes) was published as
    FAILED, which the run's end, the console, the process table and the dashboard take as
    failed for good, and then backed off. It is a BACKOFF naming the error; the next spawn
    runs the process."""
    real = ChildProcess.spawn.__func__
    errors = [SpawnError("cannot start python: Resource temporarily unavailable", permanent=False)]

    async def flaky(cls, spec, **kwargs):
        if errors:
            raise errors.pop()
        return await real(cls, spec, **kwargs)

    monkeypatch.setattr(ChildProcess, "spawn", classmethod(flaky))
    policy = RestartPolicy(policy="on_failure", backoff_base=0.05)
    h = supervise([spec("worker", WORKER, restart=policy)], exit_with="worker")
    await h.state("worker", State.RUNNING)
    changes = [(c.old, c.new) for c in h.changes("worker")]
    assert changes == [(State.PENDING, State.BACKOFF), (State.BACKOFF, State.RUNNING)]
    (restarting,) = [e for e in h.events if isinstance(e, Restarting)]
    assert restarting.reason == "cannot start python: Resource temporarily unavailable"
    assert not h.run_task.done(), "the run goes on"
QUICK_GIVE_UP = RestartPolicy(policy="on_failure", backoff_base=0.05, max_restarts=1)


def needy(**fields: object) -> list[ProcessSpec]:
    """A worker that needs at least one of two feeders; both fail for good."""
    feeders = [spec(f"feeder-{i}", BROKEN, restart=QUICK_GIVE_UP) for i in range(2)]
    need = Need(any_of=["feeder-0", "feeder-1"])
    return [*feeders, spec("worker", WORKER, needs=[need], **fields)]


async def test_a_needed_process_failing_for_good_ends_the_run_naming_its_error(
    supervise,
) -> None:
    """Issue 27 case 1: without its feeders the worker cannot go on. Once the last of them
    fails for good (not when the first does), the run ends in order (the worker stops
    cleanly: its checkpoint) with exit 1 within 5 s, and the reason and the event carry
    the feeder's real error, not only "exited with code 1"."""
    h = supervise(needy(), exit_with="worker")
    async with asyncio.timeout(30):
        outcome = await h.run_task
    ended = time.time()

    failed = [e for e in h.events if isinstance(e, StateChanged) and e.new == State.FAILED]
    assert sorted(e.process for e in failed) == ["feeder-0", "feeder-1"]
    (lost,) = [e for e in h.events if isinstance(e, NeedLost)]
    assert lost.t >= max(e.t for e in failed)
    assert lost.process == "worker" and lost.action == "stop"
    assert lost.need == "at least 1 of feeder-0, feeder-1"
    assert "gave up after 1 restarts" in lost.failed["feeder-0"]
    error = "ModuleNotFoundError: No module named 'no_such_mod'"
    assert lost.last_lines["feeder-1"][-1] == error
    assert outcome.exit_code == 1
    assert outcome.reason.startswith("worker cannot go on without at least 1 of feeder-0")
    assert error in outcome.reason
    assert ended - max(e.t for e in failed) < 5.0
    assert h.changes("worker")[-1].new == State.STOPPED
    assert "checkpoint written" in h.sup.recent_lines("worker")
    on_disk = (h.sup.run_dir / "events.jsonl").read_text()
    assert '"type": "NeedLost"' in on_disk and "No module named" in on_disk


async def test_a_run_told_to_wait_says_on_what_and_goes_on_when_the_need_is_back(
    supervise,
) -> None:
    """``on_needed_failure = "wait"``: the run goes on, a NeedLost says what the worker
    waits on; a feeder started again (here with a command that works) gives it back."""
    h = supervise(needy(), exit_with="worker", on_needed_failure="wait")
    lost = await h.until(lambda e: isinstance(e, NeedLost), timeout=20)
    assert lost.action == "wait" and lost.process == "worker"
    assert h.sup.status()["worker"].state == State.RUNNING
    assert not h.run_task.done()

    h.sup.replace_spec(spec("feeder-0", WORKER))
    await h.sup.start("feeder-0")
    regained = await h.until(lambda e: isinstance(e, NeedRegained), timeout=20)
    assert regained.process == "worker" and regained.need == lost.need
    assert not h.run_task.done()
