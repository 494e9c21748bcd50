"""``grpo-tui run`` end to end over real child processes: exit codes, run dir, JSON, signals."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

CHILD = Path(__file__).with_name("headless_child.py")
REPO = Path(__file__).resolve().parents[2]


def child(name: str, *args: str) -> str:
    """A TOML command list running the test child."""
    return json.dumps([sys.executable, str(CHILD), name, *args])


def write_profile(tmp_path: Path, body: str, exit_with: str = "worker") -> Path:
    path = tmp_path / "profile.toml"
    head = f'[run]\nname = "t"\noutput_dir = "{tmp_path / "runs"}"\nexit_with = "{exit_with}"\n'
    path.write_text(head + textwrap.dedent(body))
    return path


def grpo_tui(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "grpo_tui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def only_run_dir(tmp_path: Path) -> Path:
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_run_exits_0_when_exit_with_completes_and_fills_the_run_dir(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path,
        f"""
        [process.server]
        command = {child("server", "--ready-after", "0.3")}
        readiness = {{ kind = "log_line", pattern = "server ready", period = 0.1 }}

        [process.worker]
        command = {child("worker", "--life", "0.5", "--metrics", "3")}
        depends_on = ["server"]
        """,
    )
    done = grpo_tui("run", str(profile))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.startswith("t-")
    assert "run finished: worker completed successfully (exit 0)" in done.stdout
    assert f"run dir: {run_dir}" in done.stdout.replace("\n", "")
    assert f"view:    grpo-tui view {run_dir}" in done.stdout.replace("\n", "")
    assert f"report:  grpo-tui report {run_dir}" in done.stdout.replace("\n", "")
    assert "steps:   3 / ?, last reward 0.300" in done.stdout
    assert "metrics step 3" in done.stdout and "loss 0.3333" in done.stdout
    assert (run_dir / "logs" / "server.log").read_text().count("server ready") == 1
    assert "worker exiting with 0" in (run_dir / "logs" / "worker.log").read_text()
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["process"] == "worker"] == [1, 2, 3]
    changes = [(e["process"], e["new"]) for e in events(run_dir) if e["type"] == "StateChanged"]
    assert changes.index(("server", "ready")) < changes.index(("worker", "running"))
    assert ("worker", "completed") in changes
    again = grpo_tui("check", str(run_dir / "profile.toml"))
    assert again.returncode == 0, again.stderr


def test_run_fails_with_reason_and_log_tail(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path,
        f"""
        [process.worker]
        command = {child("worker", "--life", "0.2", "--exit", "3")}
        """,
    )
    done = grpo_tui("run", str(profile))
    assert done.returncode == 1
    assert "run failed: worker failed" in done.stdout
    assert "worker exiting with 3" in done.stdout  # the failed process's log tail


def test_run_notify_gets_the_end_of_the_run_on_stdin(tmp_path: Path) -> None:
    """``[run] notify``: a real command, the JSON payload on its stdin; a failing one is
    reported in the summary and changes nothing of the run."""
    sent = tmp_path / "sent.jsonl"
    append = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + chr(10))"
    profile = write_profile(
        tmp_path,
        f"""
        [process.worker]
        command = {child("worker", "--life", "0.2")}
        """,
    )
    notify = json.dumps([sys.executable, "-c", append, str(sent)])
    profile.write_text(profile.read_text().replace("[run]\n", f"[run]\nnotify = {notify}\n", 1))
    done = grpo_tui("run", str(profile))
    assert done.returncode == 0, done.stdout + done.stderr
    (end,) = [json.loads(line) for line in sent.read_text().splitlines()]
    run_dir = only_run_dir(tmp_path)
    assert (end["event"], end["exit_code"], end["run_dir"]) == ("end", 0, str(run_dir))
    assert "notify:" not in done.stdout

    failing = json.dumps([sys.executable, "-c", "import sys; sys.exit(5)"])
    profile.write_text(profile.read_text().replace(notify, failing))
    again = grpo_tui("run", str(profile))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "notify:  notify command for end exited 5" in again.stdout


def test_json_lines_carry_every_event_and_the_outcome(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path,
        f"""
        [process.worker]
        command = {child("worker", "--life", "0.2")}
        """,
    )
    done = grpo_tui("run", str(profile), "--json", "--mode", "lora_only")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = {r["type"] for r in records}
    assert {"StateChanged", "LogBatch", "Notice"} <= kinds
    assert any(
        r["type"] == "StateChanged" and r["process"] == "worker" and r["new"] == "completed"
        for r in records
    )
    logged = [line for r in records if r["type"] == "LogBatch" for line in r["lines"]]
    assert "worker ready" in logged
    final = records[-1]
    assert final["type"] == "RunFinished" and final["exit_code"] == 0
    run_dir = only_run_dir(tmp_path)
    assert final["run_dir"] == str(run_dir)
    assert 'mode = "lora_only"' in (run_dir / "profile.toml").read_text()


class RunningCli:
    """``grpo-tui run --json`` as a real process whose JSON lines are read as they come."""

    def __init__(self, profile: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_tui", "run", str(profile), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        self.records: list[dict[str, Any]] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, process: str, state: str, deadline: float = 60) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            record = json.loads(line)
            self.records.append(record)
            if record.get("process") == process and record.get("new") == state:
                return
        raise AssertionError(f"{process} never reached {state}: {self.records[-5:]}")

    def finish(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        while (line := self._lines.get(timeout=5)) is not None:
            self.records.append(json.loads(line))
        return code


@pytest.fixture
def pid_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the children write their pids; anything of ours still alive is killed after."""
    path = tmp_path / "pids"
    path.mkdir()
    yield path
    for pid_file in path.glob("*.pid"):
        pid = int(pid_file.read_text())
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)


def gone(pids: list[int], deadline: float = 5) -> list[int]:
    end = time.monotonic() + deadline
    alive = pids
    while alive and time.monotonic() < end:
        alive = [
            p
            for p in alive
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        time.sleep(0.05)
    return alive


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_signal_shuts_down_in_reverse_order_leaving_nothing(
    tmp_path: Path, pid_dir: Path, sig: signal.Signals
) -> None:
    profile = write_profile(
        tmp_path,
        f"""
        [process.base]
        command = {child("base", "--pid-dir", str(pid_dir), "--grandchild")}
        readiness = {{ kind = "log_line", pattern = "base ready", period = 0.1 }}

        [process.worker]
        command = {child("worker", "--pid-dir", str(pid_dir))}
        depends_on = ["base"]
        readiness = {{ kind = "log_line", pattern = "worker ready", period = 0.1 }}
        """,
    )
    cli = RunningCli(profile)
    try:
        cli.wait_for("worker", "ready")
        cli.proc.send_signal(sig)
        code = cli.finish()
    finally:
        if cli.proc.poll() is None:
            os.killpg(cli.proc.pid, signal.SIGKILL)
            cli.proc.wait()
    assert code != 0
    changes = [(r["process"], r["new"]) for r in cli.records if r["type"] == "StateChanged"]
    assert changes.index(("worker", "stopped")) < changes.index(("base", "stopping"))
    assert ("base", "stopped") in changes
    final = cli.records[-1]
    assert final["type"] == "RunFinished" and sig.name in final["reason"]
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert len(pids) == 3
    assert gone(pids) == []
