"""``prestart``: a child spawned before its dependencies are met waits at its start gate."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psutil
from conftest import child, spec

from grpo_trainer.start_gate import GATE_ENV
from grpo_tui.supervisor.events import State


def stamp(lines: list[str], word: str) -> float | None:
    return next((float(line.split()[1]) for line in lines if line.startswith(word)), None)


def waits_for(marker: Path, then: int) -> list[str]:
    """A dependency that completes (exit ``then``) only once ``marker`` exists: it can end
    only if its dependent ran before it was done."""
    code = (
        "import pathlib, sys, time\n"
        f"path = pathlib.Path({str(marker)!r})\n"
        "deadline = time.monotonic() + 30\n"
        "while not path.exists() and time.monotonic() < deadline: time.sleep(0.02)\n"
        f"sys.exit({then} if path.exists() else 9)\n"
    )
    return [sys.executable, "-c", code]


async def test_prestart_loads_before_its_dependency_and_starts_after(supervise, tmp_path) -> None:
    marker = tmp_path / "loaded"
    h = supervise(
        [
            spec("build", waits_for(marker, then=0)),
            spec(
                "gated",
                child("gated.py", marker),
                prestart=True,
                depends_on={"build": {"condition": "process_completed_successfully"}},
            ),
        ],
        exit_with="gated",
    )
    assert (await h.run_task).exit_code == 0
    built = next(e for e in h.changes("build") if e.new == State.COMPLETED)
    lines = h.sup.recent_lines("gated")
    loaded, started = stamp(lines, "loaded"), stamp(lines, "started")
    assert loaded is not None and started is not None, lines
    assert loaded < built.t <= started


async def test_prestart_child_is_stopped_when_its_dependency_fails(supervise, tmp_path) -> None:
    marker = tmp_path / "loaded"
    h = supervise(
        [
            spec("build", waits_for(marker, then=1)),
            spec(
                "gated",
                child("gated.py", marker),
                prestart=True,
                depends_on={"build": {"condition": "process_completed_successfully"}},
            ),
        ],
        exit_with="gated",
    )
    outcome = await h.run_task
    assert outcome.exit_code != 0
    status = h.sup.status()["gated"]
    assert status.state == State.FAILED
    assert "dependency build failed" in status.last_reason
    lines = h.sup.recent_lines("gated")
    assert stamp(lines, "loaded") is not None and stamp(lines, "started") is None, lines


def test_gate_closed_without_start_exits_1_and_no_gate_runs_at_once() -> None:
    code = "from grpo_trainer.start_gate import wait_for_start; wait_for_start(); print('past')"
    env = {**os.environ, GATE_ENV: "stdin"}
    closed = subprocess.run(
        [sys.executable, "-c", code], env=env, input="", capture_output=True, text=True
    )
    assert closed.returncode == 1 and "past" not in closed.stdout
    assert "start gate closed" in closed.stderr
    opened = subprocess.run(
        [sys.executable, "-c", code], env=env, input="start\n", capture_output=True, text=True
    )
    assert opened.returncode == 0 and opened.stdout == "past\n"
    env.pop(GATE_ENV)
    ungated = subprocess.run(
        [sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True,
    )  # fmt: skip
    assert ungated.returncode == 0 and ungated.stdout == "past\n"


async def test_stop_while_at_the_gate_ends_the_child_without_starting_it(
    supervise, tmp_path
) -> None:
    marker = tmp_path / "loaded"
    never = tmp_path / "never"  # the dependency waits for a file nobody writes
    h = supervise(
        [
            spec("build", waits_for(never, then=0)),
            spec(
                "gated",
                child("gated.py", marker),
                prestart=True,
                depends_on={"build": {"condition": "process_completed_successfully"}},
            ),
        ]
    )
    async with asyncio.timeout(20):
        while not marker.exists():  # the child is past its imports, at the gate
            await asyncio.sleep(0.02)
    pid = h.sup.status()["gated"].pid
    await h.sup.stop("gated")
    status = h.sup.status()["gated"]
    assert status.state == State.STOPPED
    assert stamp(h.sup.recent_lines("gated"), "started") is None
    assert pid is not None and not psutil.pid_exists(pid)
