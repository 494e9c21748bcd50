"""Helpers for end-to-end runs of the whole supervised stack.

A test copies ``profiles/quickstart.toml`` (so it follows the tuned recipe), gives it free
ports, a temporary output directory and shortened numbers, runs it with the real
``grpo-tui run`` command (or the real Supervisor over the real plan) and reads the run
directory afterwards: ``metrics.jsonl``, ``events.jsonl``, ``logs/``, ``rollouts.db``.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psutil
import tomli_w
from free_ports import free_port as free_port

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "profiles" / "quickstart.toml"
RUN_ID_VAR = "GRPO_TUI_RUN_ID"
POLL = 0.1

ValueT = TypeVar("ValueT")


def wait_until(condition: Callable[[], ValueT | None], deadline_s: float, what: str) -> ValueT:
    """Poll ``condition`` until it returns something truthy; fail after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL)
    raise AssertionError(f"timed out after {deadline_s:.0f}s waiting for {what}")


def quickstart_copy(
    tmp_path: Path,
    *,
    mode: str,
    overrides: Mapping[str, Mapping[str, Any]],
) -> Path:
    """The quickstart profile with free ports, ``tmp_path/runs`` as output and ``overrides``.

    ``overrides`` maps a table (``run``, ``api``, ``inference``, ``trainer``, ``env``) to
    keys replaced in it; ``env`` applies to every ``[[env]]`` table.
    """
    profile = tomllib.loads(QUICKSTART.read_text())
    profile["run"].update(mode=mode, output_dir=str(tmp_path / "runs"))
    profile["api"]["port"] = free_port()
    profile["inference"]["port"] = free_port()
    for table, keys in overrides.items():
        targets = profile["env"] if table == "env" else [profile[table]]
        for target in targets:
            target.update(keys)
    path = tmp_path / f"quickstart-{mode}.toml"
    path.write_text(tomli_w.dumps(profile))
    return path


def quickstart_value(table: str, key: str) -> Any:
    """A value of the quickstart profile (the first ``[[env]]`` for ``env``)."""
    profile = tomllib.loads(QUICKSTART.read_text())
    return (profile["env"][0] if table == "env" else profile[table])[key]


def only_run_dir(tmp_path: Path) -> Path | None:
    runs = tmp_path / "runs"
    found = sorted(runs.iterdir()) if runs.is_dir() else []
    return found[0] if len(found) == 1 else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of ``path`` (a line being written is skipped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def trainer_steps(run_dir: Path, since: float = 0.0) -> list[tuple[int, dict[str, Any]]]:
    """(step, data) of every trainer step record in ``metrics.jsonl`` stamped after
    ``since``, in arrival order."""
    return [
        (int(r["step"]), r["data"])
        for r in read_jsonl(run_dir / "metrics.jsonl")
        if r.get("process") == "trainer"
        and r.get("step") is not None
        and "loss" in r["data"]
        and float(r["t"]) > since
    ]


def events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if kind is None or e["type"] == kind]


def spawns(run_dir: Path, process: str) -> list[tuple[int, float]]:
    """(pid, time) of every spawn of ``process``, in order (from ``StateChanged`` events)."""
    return [
        (int(e["pid"]), float(e["t"]))
        for e in events(run_dir, "StateChanged")
        if e["process"] == process and e["new"] == "starting" and e.get("pid") is not None
    ]


def pids(run_dir: Path, process: str) -> list[int]:
    """Every pid ``process`` was spawned with, in order."""
    return [pid for pid, _ in spawns(run_dir, process)]


def ready_count(run_dir: Path, process: str) -> int:
    """How many times ``process`` passed its readiness probe."""
    return sum(
        1
        for e in events(run_dir, "StateChanged")
        if e["process"] == process and e["new"] == "ready"
    )


def spawned_run_id(run: HeadlessCli, tmp_path: Path, deadline_s: float = 120) -> str:
    """The run id of ``run`` (started in ``tmp_path``), read once its trainer is spawned."""

    def trainer_pid() -> int | None:
        run.check_alive()
        run_dir = only_run_dir(tmp_path)
        found = pids(run_dir, "trainer") if run_dir else []
        return found[0] if found else None

    return run_id_of(wait_until(trainer_pid, deadline_s, "the trainer to be spawned"))


def run_id_of(pid: int) -> str:
    """The ``GRPO_TUI_RUN_ID`` tag in a running child's environment."""
    return psutil.Process(pid).environ()[RUN_ID_VAR]


def tagged(run_id: str) -> list[str]:
    """Live processes whose environment carries ``run_id`` (pid and command line)."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(RUN_ID_VAR) == run_id:
                left.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


def queue_counts(run_dir: Path) -> dict[str, int]:
    """The API's durable counters and queue from ``rollouts.db`` (after the run).

    ``received``: groups the API answered ``received`` to; ``served``: groups consumed by
    an acknowledged batch; ``queued``: groups still in the queue (leased ones included).
    """
    with sqlite3.connect(f"file:{run_dir / 'rollouts.db'}?mode=ro", uri=True) as db:
        counters: dict[str, int] = {}
        for name, value in db.execute("SELECT name, SUM(value) FROM counters GROUP BY name"):
            counters[name] = int(value)
        queued = db.execute("SELECT COUNT(*) FROM groups").fetchone()[0]
    return {
        "received": counters.get("received", 0),
        "served": counters.get("served", 0),
        "queued": int(queued),
    }


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


class HeadlessCli:
    """``grpo-tui run PROFILE --mode M [EXTRA...]`` as a child in its own session; stopped at
    teardown. ``command``: another command taking a profile (``serve``)."""

    def __init__(
        self,
        profile: Path,
        mode: str,
        log: Path,
        extra: Sequence[str] = (),
        command: str = "run",
    ) -> None:
        self.log = log
        argv = [sys.executable, "-m", "grpo_tui", command, str(profile), "--mode", mode, *extra]
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def check_alive(self) -> None:
        """Fail with the console output if the run ended early."""
        if not self.alive:
            raise AssertionError(f"grpo-tui run exited {self.popen.returncode}:\n{self.text()}")

    def stop(self) -> None:
        """SIGTERM (ordered shutdown) to our own process group, SIGKILL if it lingers."""
        if not self.alive:
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)


def quickstart_run_to_end(
    tmp_path: Path,
    cli: list[HeadlessCli],
    *,
    mode: str,
    overrides: Mapping[str, Mapping[str, Any]],
    timeout: float,
) -> Path:
    """A ``quickstart_copy`` run through ``grpo-tui run`` to its end: exit 0 and nothing of
    the run left alive are asserted; returns the run directory."""
    run = HeadlessCli(quickstart_copy(tmp_path, mode=mode, overrides=overrides), mode,
                      tmp_path / "console.log")  # fmt: skip
    cli.append(run)
    run_id = spawned_run_id(run, tmp_path)
    assert run.wait(timeout=timeout) == 0, run.text()[-4000:]
    run_dir = only_run_dir(tmp_path)
    assert run_dir is not None
    assert tagged(run_id) == [], "processes of the run outlived it"
    return run_dir
