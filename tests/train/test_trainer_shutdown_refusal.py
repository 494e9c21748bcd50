"""A restart refused because the supervisor is shutting down stops the trainer quietly.

The supervisor side is the real one: grpo-tui's ``ControlServer`` on a Unix socket, whose
restart handler raises the supervisor's own ``ShuttingDown`` (what ``Supervisor.restart``
raises once shutdown has begun), so the reply text is exactly what a run sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from train_helpers import REPO, make_groups, tiny_model, trainer_command, trainer_env, write_groups

from grpo_trainer.control import ControlError, SupervisorLink, SupervisorShuttingDown
from grpo_trainer.sync.client import InferenceClient
from grpo_trainer.sync.restart import SupervisorStopping, restart_inference
from grpo_trainer.train.resume import resolve_resume
from grpo_tui.supervisor.control import ControlServer
from grpo_tui.supervisor.supervisor import ShuttingDown


class ShuttingDownSupervisor:
    """A real control socket whose every restart is refused as during shutdown."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: list[tuple[str, str | None, dict[str, Any]]] = []
        self.server = ControlServer(
            path,
            on_metrics=lambda record: None,
            on_event=lambda event: None,
            on_request=self._on_request,
            identify=lambda pid: None,
            on_health=lambda name, ok, reason: None,
        )

    async def _on_request(
        self, name: str, action: str, target: str | None, args: dict[str, Any]
    ) -> dict[str, Any]:
        self.requests.append((action, target, args))
        if action == "restart":
            raise ShuttingDown(f"supervisor is shutting down: not starting {target}")
        return {"processes": {}}


@pytest.fixture
async def supervisor() -> AsyncIterator[ShuttingDownSupervisor]:
    with tempfile.TemporaryDirectory(prefix="grpo-sd-") as short:  # sun_path is 108 bytes
        side = ShuttingDownSupervisor(Path(short) / "control.sock")
        await side.server.start()
        try:
            yield side
        finally:
            await side.server.close()


async def test_link_and_restart_raise_the_shutdown_refusal_at_once(
    supervisor: ShuttingDownSupervisor,
) -> None:
    link = SupervisorLink(str(supervisor.path), process="trainer")
    client = InferenceClient("http://127.0.0.1:1", attempts=1)
    try:
        with pytest.raises(SupervisorShuttingDown, match="not starting inference") as caught:
            await asyncio.to_thread(link.request, "restart", "inference", {}, 10)
        assert isinstance(caught.value, ControlError)
        with pytest.raises(SupervisorStopping, match="supervisor is shutting down"):
            await asyncio.to_thread(
                restart_inference, link, client, {"model": "m"}, timeout=10, backoff=0.01
            )
        assert await asyncio.to_thread(link.request, "status", None, None, 10) == {"processes": {}}
    finally:
        client.close()
        await asyncio.to_thread(link.close)
    restarts = [r for r in supervisor.requests if r[0] == "restart"]
    assert len(restarts) == 2, "the refused restart is not retried"


async def test_trainer_stops_checkpoints_and_exits_0_on_the_refusal(
    supervisor: ShuttingDownSupervisor, tmp_path: Path
) -> None:
    """Also: under a supervisor with no thread settings, the CPU trainer takes one thread."""
    model = tiny_model(tmp_path / "model")
    data = write_groups(
        tmp_path / "groups.jsonl", make_groups(model, count=6, group_size=2, seed=5)
    )
    save = tmp_path / "ckpt"
    command = trainer_command(
        model,
        save,
        data,
        "--batch-size",
        "2",
        "--weight-bridge-mode",
        "none",
        "--none-reload",
        "restart",
        "--sync-every",
        "1",
        "--training-steps",
        "3",
        "--checkpoint-interval",
        "0",
    )
    env = trainer_env(GRPO_TUI_SOCKET=str(supervisor.path), GRPO_TUI_PROCESS="trainer")
    del env["OMP_NUM_THREADS"]  # the trainer's own CPU default is checked below
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(120):
            _out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    stderr = err.decode()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "[error]" not in stderr, stderr
    assert "supervisor is shutting down" in stderr
    assert [(a, t) for a, t, _ in supervisor.requests] == [("restart", "inference")]
    assert "torch CPU threads: 1" in stderr.splitlines(), "device cpu: one thread unless set"
    point = resolve_resume(save, "none")
    assert point is not None and point.step == 1, "step 1 is checkpointed, no step after it"
