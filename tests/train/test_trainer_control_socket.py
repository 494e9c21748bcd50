"""Metrics reach a real Unix socket server and metrics.jsonl; a dead socket never stops
training; requests get their reply (or a clear error)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_helpers import REPO, make_groups, tiny_model, trainer_command, trainer_env, write_groups

from grpo_trainer.control import ControlError, SupervisorLink
from grpo_trainer.train.phases import PHASES


class SocketServer:
    """A minimal supervisor side: records every line; answers requests by a rule."""

    def __init__(self, path: Path, refuse: set[str] | None = None, silent: bool = False) -> None:
        self.path = path
        self.records: list[dict] = []
        self.refuse = refuse or set()
        self.silent = silent
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                record = json.loads(line)
                self.records.append(record)
                if record["type"] == "request" and not self.silent:
                    ok = record["action"] not in self.refuse
                    reply = {
                        "type": "reply",
                        "id": record["id"],
                        "ok": ok,
                        "error": None if ok else "not allowed here",
                        "result": {"echo": record["args"]} if ok else {},
                    }
                    conn.sendall(json.dumps(reply).encode() + b"\n")

    def steps(self) -> list[int]:
        """Steps of the per-step records (the live ``phase/current`` records carry no loss)."""
        return [
            r["step"] for r in list(self.records) if r["type"] == "metrics" and "loss" in r["data"]
        ]

    def phases(self) -> list[float]:
        return [
            r["data"]["phase/current"]
            for r in list(self.records)
            if r["type"] == "metrics" and "phase/current" in r["data"]
        ]

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            # shut down first: a bare close() leaves the peer unaware while a thread of
            # ours is still blocked reading it
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def sock_dir(tmp_path: Path) -> Path:
    # AF_UNIX paths are limited to ~107 bytes: keep the socket path short
    short = Path(f"/tmp/h4s-{os.getpid()}-{time.monotonic_ns()}")
    short.mkdir()
    yield short
    for child in short.iterdir():
        child.unlink()
    short.rmdir()


@pytest.fixture
def servers() -> Iterator[list[SocketServer]]:
    made: list[SocketServer] = []
    yield made
    for server in made:
        server.close()


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_request_reply_refusal_and_timeout(sock_dir: Path, servers) -> None:
    servers.append(SocketServer(sock_dir / "ok.sock", refuse={"restart"}))
    link = SupervisorLink(str(sock_dir / "ok.sock"), process="trainer")
    try:
        assert link.request("status", args={"x": 1}, timeout=10) == {"echo": {"x": 1}}
        with pytest.raises(ControlError, match="refused 'restart': not allowed here"):
            link.request("restart", process="inference", timeout=10)
        link.send_metrics(3, {"loss": 0.5})
        link.send_event("info", "hello")
        wait_until(lambda: len(servers[0].records) >= 5, 10, "records")
    finally:
        link.close()
    kinds = [r["type"] for r in servers[0].records]
    assert kinds[0] == "hello" and servers[0].records[0]["process"] == "trainer"
    assert {"metrics", "event", "request"} <= set(kinds)

    servers.append(SocketServer(sock_dir / "mute.sock", silent=True))
    mute = SupervisorLink(str(sock_dir / "mute.sock"))
    try:
        with pytest.raises(ControlError, match="no reply to 'status'"):
            mute.request("status", timeout=0.5)
    finally:
        mute.close()


def test_health_is_said_again_on_each_connection(sock_dir: Path, servers) -> None:
    """A process's health is a state, not an event: said while the supervisor could not be
    reached, or with the queue full (records dropped), it still reaches it; the latest one
    is said again after a reconnection."""
    path = sock_dir / "h.sock"
    link = SupervisorLink(str(path), process="env", queue_size=1)
    failing = {"type": "health", "ok": False, "reason": "the task fails"}
    ok = {"type": "health", "ok": True, "reason": "ran through"}
    try:
        for step in range(3):
            link.send_metrics(step, {"x": 1.0})  # the queue is full: dropped
        link.send_health(False, "the task fails")  # nobody listens yet
        servers.append(SocketServer(path))
        wait_until(lambda: failing in servers[0].records, 10, "the failing health")
        link.send_health(True, "ran through")
        wait_until(lambda: ok in servers[0].records, 10, "the ok health")
        servers[0].close()
        servers.append(SocketServer(path))
        wait_until(lambda: len(servers[1].records) >= 2, 10, "hello and health again")
    finally:
        link.close()
    assert servers[0].records[0]["type"] == "hello"
    assert [r for r in servers[0].records if r["type"] == "health"] == [failing, ok]
    hello, health = servers[1].records[:2]
    assert (hello["type"], health) == ("hello", ok)


def test_link_without_supervisor_never_blocks(sock_dir: Path) -> None:
    link = SupervisorLink(str(sock_dir / "absent.sock"), queue_size=10)
    started = time.monotonic()
    for step in range(1000):
        link.send_metrics(step, {"loss": 1.0})
    assert time.monotonic() - started < 5  # loose bound: puts are non-blocking, not timed
    assert link.dropped > 0
    assert not link.connected
    link.close()


def test_metrics_reach_socket_and_file_and_survive_socket_death(
    tmp_path: Path, sock_dir: Path, servers
) -> None:
    model = tiny_model(tmp_path / "model")
    groups = make_groups(model, count=8, group_size=2, seed=5, policy_version=0)
    data = write_groups(tmp_path / "groups.jsonl", groups[:3])
    path = sock_dir / "sup.sock"
    servers.append(SocketServer(path))
    metrics_file = tmp_path / "metrics.jsonl"
    command = trainer_command(
        model,
        tmp_path / "ckpt",
        data,
        "--batch-size",
        "2",
        "--training-steps",
        "8",
        "--metrics-file",
        str(metrics_file),
    )
    env = trainer_env(GRPO_TUI_SOCKET=str(path), GRPO_TUI_PROCESS="trainer")
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: servers[0].steps() == [1, 2, 3], 120, "steps 1-3 on the socket")
        servers[0].close()  # the supervisor dies while the trainer waits for data
        write_groups(data, groups[3:5], mode="a")
        wait_until(
            lambda: metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 5,
            60,
            "steps 4-5 in the file",
        )
        servers.append(SocketServer(path))  # and comes back: the link reconnects
        wait_until(lambda: bool(servers[1].records), 30, "hello on the new socket")
        write_groups(data, groups[5:], mode="a")
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, out
    assert "grpo-trainer ready" in out
    file_records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [r["step"] for r in file_records] == list(range(1, 9))
    wanted = {
        "loss",
        "lr",
        "grad_norm",
        "mean_ratio",
        "clipped_fraction",
        "reward/mean",
        "alignment/diff_abs_mean",
        "tokens_per_s",
        "step_time",
        "off_policy_lag",
        "peak_memory_gb",
        "entropy",
        "completion_len/mean",
        "data_wait_time",
        "phase/generating_s",
        "phase/training_s",
        "phase/syncing_s",
    }
    assert wanted <= set(file_records[0]["data"])
    # the device's phase went live to the supervisor: generating, training, syncing, ...
    generating, training, syncing = (PHASES.index(p) for p in ("generating", "training", "syncing"))
    assert servers[0].phases()[:4] == [generating, training, syncing, generating]
    assert file_records[0]["data"]["off_policy_lag"] == 0
    assert file_records[-1]["data"]["off_policy_lag"] == 7
    assert servers[1].records[0]["type"] == "hello"  # reconnected to the new server
    assert servers[1].steps() and max(servers[1].steps()) == 8
