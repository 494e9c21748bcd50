"""The control socket's TCP side (children on other nodes of a cluster): token or nothing."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

from grpo_trainer.control import SupervisorLink
from grpo_tui.supervisor.control import ControlEndpoint, ControlServer
from grpo_tui.supervisor.events import Event, MetricsRecord, Notice

TOKEN = "s3cret-token"


async def test_tcp_peer_with_the_token_reports_and_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics: list[MetricsRecord] = []
    notices: list[Event] = []

    async def on_request(name: str, action: str, target: str | None, args: dict) -> dict[str, Any]:
        return {"asked_by": name, "action": action}

    endpoint = ControlEndpoint(address="127.0.0.1", port=free_port(), token=TOKEN, bind="127.0.0.1")
    server = ControlServer(
        tmp_path / "control.sock",
        on_metrics=metrics.append,
        on_event=notices.append,
        on_request=on_request,
        identify=lambda pid: None,
        on_health=lambda name, ok, reason: None,
        tcp=endpoint,
    )
    await server.start()
    try:
        # a peer without the token: its records are never read
        with socket.create_connection(("127.0.0.1", endpoint.port)) as intruder:
            hello = {"type": "hello", "process": "intruder", "token": "wrong"}
            record = {"type": "metrics", "step": 1, "data": {"loss": 9.0}}
            intruder.sendall((json.dumps(hello) + "\n" + json.dumps(record) + "\n").encode())
            intruder.settimeout(10)
            assert await asyncio.to_thread(intruder.recv, 100) == b""  # closed on it
        assert metrics == []
        assert any(isinstance(n, Notice) and "refused a TCP peer" in n.message for n in notices)

        monkeypatch.setenv("GRPO_TUI_CONTROL_TOKEN", TOKEN)
        link = SupervisorLink(endpoint.url, process="trainer")
        try:
            link.send_metrics(3, {"loss": 0.5})
            reply = await asyncio.to_thread(link.request, "status", timeout=10)
        finally:
            link.close()
        assert reply == {"asked_by": "trainer", "action": "status"}
        assert [(m.process, m.step, m.data) for m in metrics] == [("trainer", 3, {"loss": 0.5})]
    finally:
        await server.close()
