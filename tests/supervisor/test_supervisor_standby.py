"""``standby``: the next incarnation waits at its start gate, imports done, while the current
one runs; a restart (or a crash restart) adopts it with the new command."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import psutil
import pytest
from conftest import child, spec

from grpo_trainer.start_gate import GATE_ENV
from grpo_tui.supervisor.events import Notice, State, StateChanged
from grpo_tui.supervisor.spec import LogLineProbe, ProcessSpec
from grpo_tui.supervisor.standby import STANDBY_ADOPTED
from grpo_tui.supervisor.tree import tagged

READY = LogLineProbe(pattern=r"^started ", period=0.05)


def server(*args: object, env: dict[str, str] | None = None, **fields: Any) -> ProcessSpec:
    return spec(
        "server",
        child("standby.py", *args),
        prestart=True,
        standby=True,
        readiness=fields.pop("readiness", READY),
        env=env or {},
        shutdown={"timeout": 5},
        **fields,
    )


def started(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(pid, arguments) of each ``started`` line, in order."""
    found = []
    for line in lines:
        if line.startswith("started "):
            _, pid, args = line.split(" ", 2)
            found.append((int(pid), json.loads(args)))
    return found


def notices(h: Any, text: str) -> list[Notice]:
    return [e for e in h.events if isinstance(e, Notice) and text in e.message]


def adopted(h: Any) -> list[int]:
    """The pid of each standby a start adopted, from the structured notice."""
    return [e.data["pid"] for e in h.events if isinstance(e, Notice) and e.code == STANDBY_ADOPTED]


async def standby_pid(h: Any) -> int:
    """The pid of the standby once it is spawned (from the supervisor's notice)."""
    life = h.sup._life("server")
    await h.until(lambda e: isinstance(e, Notice) and "standby spawned" in e.message)
    assert life.standby.child is not None
    return life.standby.child.pid


async def test_restart_adopts_the_standby_with_the_new_command(supervise) -> None:
    h = supervise([server("first")], respec=lambda name, args: server(*args["argv"]))
    await h.state("server", State.READY)
    first = h.sup.status()["server"].pid
    spare = await standby_pid(h)
    assert spare != first and psutil.Process(spare).is_running()
    await h.sup.restart("server", args={"argv": ["second", "x"]})
    assert h.sup.status()["server"].pid == spare  # the standby became the new incarnation
    assert not psutil.pid_exists(first)
    assert started(h.sup.recent_lines("server")) == [(first, ["first"]), (spare, ["second", "x"])]
    assert adopted(h) == [spare]
    nxt = await standby_pid_after(h, spare)  # a new standby for the next restart
    assert nxt not in (first, spare)
    await h.sup.shutdown("test")
    await h.run_task
    assert not psutil.pid_exists(nxt) and tagged(h.sup.run_id) == []


async def standby_pid_after(h: Any, previous: int) -> int:
    life = h.sup._life("server")
    await h.until(
        lambda e: (
            isinstance(e, Notice)
            and "standby spawned" in e.message
            and f"pid {previous}," not in e.message
            and life.standby.child is not None
            and life.standby.child.pid != previous
        )
    )
    return life.standby.child.pid


async def test_an_adopted_standby_has_the_next_one_spawned_before_it_is_ready(supervise) -> None:
    """Restarts may follow each other sooner than a start plus the imports (``lora_restart``
    on an H200: a sync every ~25 s, vLLM's imports 16-20 s, its engine start ~7 s): the
    next standby is spawned once the adopted one is past its gate, not once it is ready
    (here it never is), so that the next restart finds its imports done."""
    never = LogLineProbe(pattern=r"^never$", period=0.05)
    h = supervise([server("first")], respec=lambda name, args: server("second", readiness=never))
    await h.state("server", State.READY)
    spare = await standby_pid(h)
    restart = asyncio.create_task(h.sup.restart("server", args={"again": True}))
    nxt = await standby_pid_after(h, spare)
    assert h.sup.status()["server"].pid == spare and h.sup.status()["server"].state == "starting"
    assert nxt != spare and psutil.Process(nxt).is_running()
    await h.sup.shutdown("test")
    await h.run_task
    restart.cancel()
    await asyncio.gather(restart, return_exceptions=True)
    assert tagged(h.sup.run_id) == []


async def test_a_crash_restart_adopts_the_standby(supervise) -> None:
    """The standby comes up while the first incarnation runs; that one is then killed (the
    restart policy restarts it), and the standby is its next incarnation, run as spawned."""
    h = supervise([server("run", restart={"policy": "always", "backoff_base": 0.05})])
    await h.state("server", State.READY)
    first = h.sup.status()["server"].pid
    spare = await standby_pid(h)
    os.kill(first, 9)
    await h.until(lambda e: isinstance(e, StateChanged) and e.new == State.READY and e.pid == spare)
    assert adopted(h) == [spare]
    assert started(h.sup.recent_lines("server"))[-1] == (spare, ["run"])


async def test_a_changed_environment_spawns_afresh_and_stops_the_standby(supervise) -> None:
    h = supervise(
        [server("a", env={"X": "1"})],
        respec=lambda name, args: server("b", env={"X": args["x"]}),
    )
    await h.state("server", State.READY)
    spare = await standby_pid(h)
    await h.sup.restart("server", args={"x": "2"})
    now = h.sup.status()["server"].pid
    assert now != spare and not psutil.pid_exists(spare)
    assert notices(h, "environment or directory changed")
    assert started(h.sup.recent_lines("server"))[-1] == (now, ["b"])


async def test_stop_ends_the_standby_too(supervise) -> None:
    h = supervise([server("a")])
    await h.state("server", State.READY)
    spare = await standby_pid(h)
    await h.sup.stop("server")
    assert not psutil.pid_exists(spare)
    assert h.sup._life("server").standby.child is None


async def test_a_standby_that_exits_while_waiting_is_reported_and_not_used(
    supervise, tmp_path
) -> None:
    h = supervise([server("a")], respec=lambda name, args: server("b"))
    await h.state("server", State.READY)
    spare = await standby_pid(h)
    psutil.Process(spare).kill()
    await h.until(lambda e: isinstance(e, Notice) and "while it waited" in e.message)
    await h.sup.restart("server", args={"b": 1})
    pid = h.sup.status()["server"].pid
    assert pid != spare and started(h.sup.recent_lines("server"))[-1] == (pid, ["b"])


def test_standby_needs_prestart() -> None:
    with pytest.raises(ValueError, match="standby needs prestart"):
        ProcessSpec(name="x", command=["true"], standby=True)


def run_gated(line: str, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, GATE_ENV: "stdin"}
    return subprocess.run(
        [sys.executable, "-c", code, "own", "args"], env=env, input=line, capture_output=True,
        text=True,
    )  # fmt: skip


def test_a_command_at_the_gate_replaces_the_arguments_after_the_own_launch() -> None:
    code = "from grpo_trainer.start_gate import wait_for_command; print(wait_for_command())"
    own = [sys.executable, "-c", code]
    handed = run_gated(f"start {json.dumps([*own, 'new', 'x y'])}\n", code)
    assert handed.returncode == 0 and handed.stdout == "['new', 'x y']\n", handed.stderr
    plain = run_gated("start\n", code)
    assert plain.returncode == 0 and plain.stdout == "None\n"
    other = run_gated(f"start {json.dumps(['python3', '-m', 'other', 'a'])}\n", code)
    assert other.returncode == 2 and "cannot run" in other.stderr
    bad = run_gated("start {not json\n", code)
    assert bad.returncode == 2 and "not JSON" in bad.stderr


def test_a_program_that_is_no_standby_refuses_a_command() -> None:
    code = "from grpo_trainer.start_gate import wait_for_start; wait_for_start(); print('past')"
    handed = run_gated(f"start {json.dumps([sys.executable, '-c', code, 'a'])}\n", code)
    assert handed.returncode == 2 and "past" not in handed.stdout
    assert "no standby" in handed.stderr


async def test_a_start_as_a_process_fails_for_good_starts_it_once_its_standby_is_gone(
    supervise,
) -> None:
    """A start asked right after a failure for good (a key pressed as the failure shows)
    starts the process again: it was taken for a live one while its life stopped the
    standby, and did nothing (CI, 2026-11-27: a need never regained). The standby here
    takes 2 s to stop, so the start comes while it does, every time."""
    slow = server("a", restart={"policy": "no"}, env={"TERM_DELAY": "2"})
    h = supervise([slow, spec("other", child("standby.py"))])
    await h.state("server", State.READY)
    await standby_pid(h)
    os.kill(h.sup.status()["server"].pid, 9)
    failed = await h.state("server", State.FAILED)
    assert h.sup._life("server").active, "the life still stops its standby"
    await h.sup.start("server")
    again = await h.until(
        lambda e: isinstance(e, StateChanged) and e.process == "server" and e.t > failed.t
        and e.new == State.READY
    )  # fmt: skip
    assert again.pid != failed.pid


async def test_a_process_that_fails_for_good_takes_its_standby_along(supervise) -> None:
    """Another process keeps the run going: the standby goes with the failure itself."""
    h = supervise([server("a", restart={"policy": "no"}), spec("other", child("standby.py"))])
    await h.state("server", State.READY)
    spare = await standby_pid(h)
    os.kill(h.sup.status()["server"].pid, 9)
    await h.state("server", State.FAILED)
    async with asyncio.timeout(20):
        while psutil.pid_exists(spare) and psutil.Process(spare).status() != "zombie":
            await asyncio.sleep(0.05)
    assert h.sup._life("server").standby.child is None
    assert not h.run_task.done(), "the run goes on"
