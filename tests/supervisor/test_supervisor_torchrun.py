"""A torchrun group (2 ranks on gloo, built by the real launcher) as one supervised process.

Every rank's lines reach the log prefixed with its rank; a crashed rank takes the group
down and the restart policy brings it back resumed from the last checkpoint; a stop makes
every rank finish its step and checkpoint; a SIGKILLed supervisor leaves no rank and no
torchrun agent alive. The ranks are ``children/ranks.py``, a trainer-like loop.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import psutil
from conftest import CHILDREN, alive, child, spec

from grpo_tui.plan.launchers import Launch, Placement, Torchrun
from grpo_tui.supervisor.events import LogBatch, Restarting, State
from grpo_tui.supervisor.spec import RestartPolicy

READY = {"kind": "log_line", "pattern": "grpo-trainer ready"}


def group_command(state: Path, log_dir: Path) -> Launch:
    launcher = Torchrun(log_dir=log_dir, shutdown_timeout=30)
    return launcher.wrap(Launch(argv=child("ranks.py", state)), Placement(ranks=2))


def recorded(state: Path) -> list[int]:
    """Every rank's pid and its torchrun agent's pid, over all incarnations."""
    pids: set[int] = set()
    for path in state.glob("pids.*"):
        for line in path.read_text().split("\n"):
            pids.update(int(word) for word in line.split())
    return sorted(pids)


async def test_group_logs_ranks_restarts_after_a_crash_and_stops_with_a_checkpoint(
    supervise, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "crash").write_text("1 3")  # rank 1 dies at step 3, once
    launch = group_command(state, tmp_path / "ranks")
    policy = RestartPolicy(policy="on_failure", backoff_base=0.1, max_restarts=2)
    h = supervise(
        [
            spec(
                "trainer",
                launch.argv,
                env=launch.env,
                readiness=READY,
                restart=policy,
                shutdown={"timeout": 30},
            )
        ]
    )
    restart = await h.until(lambda e: isinstance(e, Restarting), timeout=90)
    assert isinstance(restart, Restarting) and restart.process == "trainer"
    await h.until(
        lambda e: isinstance(e, LogBatch) and "[rank1] resumed at step 2" in e.lines, timeout=90
    )
    await h.until(lambda e: isinstance(e, LogBatch) and "[rank1] step 4" in e.lines, timeout=60)
    await h.sup.stop("trainer")
    assert h.sup.status()["trainer"].state == State.STOPPED
    lines = [line for e in h.events if isinstance(e, LogBatch) for line in e.lines]
    for rank in (0, 1):
        assert f"[rank{rank}] step 1" in lines
        assert lines.count(f"[rank{rank}] resumed at step 2") == 1, "resumed from the checkpoint"
    assert "[rank1] crashing at step 3" in lines
    backoff = [e for e in h.changes("trainer") if e.new == State.BACKOFF]
    assert backoff and backoff[0].exit_code not in (0, None), "torchrun exited non-zero"
    finals = {
        rank: int(found.group(1))
        for rank in (0, 1)
        for line in lines
        if (found := re.fullmatch(rf"\[rank{rank}\] stopped after step (\d+), saved", line))
    }
    assert set(finals) == {0, 1}, "every rank finished its step and saved"
    assert finals[0] == finals[1] >= 4
    assert int((state / "ckpt").read_text()) == finals[0]
    assert alive(recorded(state)) == []


def test_sigkilled_supervisor_leaves_no_rank_and_no_torchrun(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    host = psutil.Popen(
        [sys.executable, str(CHILDREN / "torchrun_host.py"), str(tmp_path / "run"), str(state)],
        stdout=-3,
        stderr=-3,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while len(pids := recorded(state)) < 3:  # two ranks and their torchrun agent
            assert host.poll() is None, "the supervisor host exited early"
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.05)
        assert len(alive(pids)) == 3
        host.send_signal(signal.SIGKILL)
        host.wait()
        killed_at = time.monotonic()
        while alive(pids) and time.monotonic() - killed_at < 10.0:
            time.sleep(0.05)
        assert alive(pids) == [], "ranks or torchrun outlived the supervisor by 10 s"
    finally:
        for pid in alive([host.pid, *pids]):
            psutil.Process(pid).kill()
