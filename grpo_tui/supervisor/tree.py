"""Finding and ending every descendant of a child, including those that left its group.

A child that calls ``setsid`` (vLLM's engine core does) leaves its process group, and once
its parent dies it leaves the process tree too. What it keeps is its environment: every
descendant inherits ``GRPO_TUI_RUN_ID`` and ``GRPO_TUI_PROCESS``, so a scan of the
environments of our own user's processes finds them all. Zombies count as gone: they hold
no resources and may wait forever for a parent (or a pid 1) that never reaps them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable

import psutil

RUN_ID_VAR = "GRPO_TUI_RUN_ID"
PROCESS_VAR = "GRPO_TUI_PROCESS"


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (``is_running`` also guards against pid reuse)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tagged(run_id: str, process: str | None = None) -> list[psutil.Process]:
    """Live processes of this user whose environment carries this run's tag (and name)."""
    return _live(lambda proc: _tagged_with(proc, run_id, process))


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes in process group ``pgid``."""
    return _live(lambda proc: os.getpgid(proc.pid) == pgid)


def members(pgid: int, run_id: str, process: str) -> list[psutil.Process]:
    """``group_members`` and ``tagged`` together, in one pass over the process table (a
    dead child's leftovers are looked for at once, on a box that may be busy)."""
    return _live(lambda proc: os.getpgid(proc.pid) == pgid or _tagged_with(proc, run_id, process))


def _tagged_with(proc: psutil.Process, run_id: str, process: str | None) -> bool:
    env = proc.environ()
    return env.get(RUN_ID_VAR) == run_id and process in (None, env.get(PROCESS_VAR))


def _live(match: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
    """Live processes (but this one) that ``match``; those that vanish meanwhile are not."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if match(proc) and is_alive(proc):
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def descendants(pid: int) -> list[psutil.Process]:
    """A snapshot of the live tree under ``pid`` (not including it)."""
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if is_alive(p)]
    except psutil.Error:
        return []


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            if proc.is_running():
                proc.send_signal(sig)
        except psutil.Error:
            continue


def alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if is_alive(p)]


def terminate_all(
    procs: Iterable[psutil.Process], pgids: Iterable[int], *, grace: float
) -> list[psutil.Process]:
    """SIGTERM processes and groups, SIGKILL what is left after ``grace`` s; the survivors.

    Blocking (it polls); used by the watchdog, which has nothing else to do.
    """
    procs, pgids = list(procs), list(pgids)
    for pgid in pgids:
        signal_group(pgid, signal.SIGTERM)
    signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pgid in pgids:
        signal_group(pgid, signal.SIGKILL)
    signal_all(procs, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while (left := alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left
