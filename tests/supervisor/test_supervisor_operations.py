"""Operations racing each other or the run's end: shutdown, concurrent restarts, crash respec."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from conftest import child, free_port, spec

from grpo_tui.supervisor.events import Notice, ProcessPlanned, Restarting, State
from grpo_tui.supervisor.spec import RestartPolicy, Shutdown, TcpProbe
from grpo_tui.supervisor.supervisor import ProcessFailed, ShuttingDown


def stubborn(name: str = "inference", timeout: float = 1.0) -> object:
    """A child that ignores SIGTERM, so stopping it takes the whole shutdown timeout."""
    return spec(
        name,
        child("stubborn.py"),
        role="inference",
        readiness={"kind": "log_line", "pattern": "ignoring SIGTERM"},
        shutdown=Shutdown(timeout=timeout),
    )


async def test_restart_in_flight_when_shutdown_begins_is_refused(supervise) -> None:
    h = supervise([stubborn()])
    await h.state("inference", State.READY)
    restart = asyncio.create_task(h.sup.restart("inference"))
    await h.state("inference", State.STOPPING)
    await h.sup.shutdown("test")
    await h.run_task
    with pytest.raises(ShuttingDown, match="shutting down"):
        async with asyncio.timeout(10):
            await restart
    spawns = [e for e in h.changes("inference") if e.new == State.STARTING]
    assert len(spawns) == 1, "inference was started again after shutdown began"
    assert h.sup.status()["inference"].state == State.STOPPED
    with pytest.raises(ShuttingDown):
        await h.sup.start("inference")
    assert h.sup.status()["inference"].pid is None


async def test_control_restart_during_shutdown_replies_not_ok(supervise) -> None:
    port = free_port()
    inference = spec(
        "inference",
        child("listener.py", "--port", port),
        role="inference",
        readiness=TcpProbe(port=port, period=0.05),
    )
    trainer = spec(
        "trainer",
        child("asker.py", "inference"),
        role="trainer",
        depends_on={"inference": {"condition": "process_healthy"}},
        readiness={"kind": "log_line", "pattern": "asker ready"},
        shutdown=Shutdown(timeout=20),
    )
    h = supervise([inference, trainer])
    await h.state("trainer", State.READY)
    await h.sup.shutdown("test")
    async with asyncio.timeout(30):
        await h.run_task
    line = next(x for x in h.sup.recent_lines("trainer") if x.startswith("reply "))
    reply = json.loads(line.removeprefix("reply "))
    assert not reply["ok"] and "shutting down" in reply["error"]
    assert len([e for e in h.changes("inference") if e.new == State.STARTING]) == 1
    assert h.sup.status()["inference"].state == State.STOPPED
    assert any(isinstance(e, Notice) and "run ended" in e.message for e in h.events)


def worker() -> object:
    """A quick child that restarts on failure, so a SIGKILL it did not ask for shows as a crash."""
    return spec(
        "worker",
        [sys.executable, "-c", "import time\nprint('up', flush=True)\ntime.sleep(600)"],
        readiness={"kind": "log_line", "pattern": "^up$"},
        restart=RestartPolicy(policy="on_failure", backoff_base=0.05, max_restarts=20),
    )


async def test_concurrent_restarts_are_serialised(supervise) -> None:
    h = supervise([worker()])
    await h.state("worker", State.READY)
    for _ in range(3):
        restarts = [h.sup.restart("worker") for _ in range(3)]
        async with asyncio.timeout(30):
            await asyncio.gather(*restarts)
        assert h.sup.status()["worker"].state == State.READY
    assert not [e for e in h.events if isinstance(e, Restarting)], "a fresh child was killed"
    status = h.sup.status()["worker"]
    assert status.restarts == 0 and status.pid is not None
    ended = [e for e in h.changes("worker") if e.new in (State.BACKOFF, State.FAILED)]
    assert ended == []


async def test_stop_then_restart_and_restart_then_stop_end_as_asked(supervise) -> None:
    h = supervise([worker()])
    await h.state("worker", State.READY)
    async with asyncio.timeout(30):
        await asyncio.gather(h.sup.stop("worker"), h.sup.restart("worker"))
    assert h.sup.status()["worker"].state == State.READY
    restart = asyncio.create_task(h.sup.restart("worker"))
    stop = asyncio.create_task(h.sup.stop("worker"))  # a task: it runs after the restart's
    async with asyncio.timeout(30):
        await stop
    try:  # the restart may finish before the stop takes the process, or be cut short by it
        async with asyncio.timeout(30):
            await restart
    except ProcessFailed as error:
        assert "stopped" in str(error)
    status = h.sup.status()["worker"]
    assert status.state == State.STOPPED and status.pid is None and status.restarts == 0


def versioned(version: str, *, crash: bool) -> object:
    """A child printing its spec's version; the crashing one exits 3 before it is ready."""
    code = f"print('{version}', flush=True)\n" + (
        "raise SystemExit(3)" if crash else "print('up', flush=True)\nimport time\ntime.sleep(600)"
    )
    return spec(
        "server",
        [sys.executable, "-c", code],
        role="inference",
        readiness={"kind": "log_line", "pattern": "^up$"},
        restart=RestartPolicy(policy="on_failure", backoff_base=0.05, max_restarts=1),
    )


async def test_crash_restart_rebuilds_the_spec_through_respec(supervise) -> None:
    calls: list[tuple[str, dict]] = []

    def respec(name: str, args: dict) -> object:
        calls.append((name, dict(args)))
        return versioned("v2", crash=False)

    h = supervise([versioned("v1", crash=True)], respec=respec)
    await h.state("server", State.READY)
    assert calls == [("server", {})]
    assert h.sup.recent_lines("server") == ["v1", "v2", "up"]
    assert h.sup.status()["server"].restarts == 1
    planned = [e for e in h.events if isinstance(e, ProcessPlanned)]
    assert [e.command[-1].splitlines()[0] for e in planned] == [
        "print('v1', flush=True)",
        "print('v2', flush=True)",
    ]
    assert {(e.process, e.role, e.port) for e in planned} == {("server", "inference", None)}
    journal = (h.sup.run_dir / "events.jsonl").read_text()
    assert journal.count('"type": "ProcessPlanned"') == 2


async def test_crash_restart_keeps_the_last_spec_when_respec_raises(supervise) -> None:
    def respec(name: str, args: dict) -> object:
        raise ValueError("no adapter yet")

    h = supervise([versioned("v1", crash=True)], respec=respec, exit_with="server")
    async with asyncio.timeout(30):
        outcome = await h.run_task
    assert outcome.exit_code == 1 and "gave up after 1 restarts" in outcome.reason
    assert h.sup.recent_lines("server") == ["v1", "v1"]
    notices = [e.message for e in h.events if isinstance(e, Notice) and "respec" in e.message]
    assert len(notices) == 1 and "no adapter yet" in notices[0]
