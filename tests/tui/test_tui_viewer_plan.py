"""``grpo-tui view`` shows each process's role and port from ``events.jsonl`` alone."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from free_ports import free_port

from grpo_tui.app import GrpoTuiApp
from grpo_tui.run_files import load_run
from grpo_tui.supervisor.events import State
from grpo_tui.supervisor.spec import ProcessSpec, TcpProbe
from grpo_tui.supervisor.supervisor import Supervisor
from grpo_tui.widgets.process_table import ProcessTable

SERVER = "import socket, sys, time\ns = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
SERVER += "while True: time.sleep(1)"


async def test_viewer_rows_carry_role_and_port_from_the_journal(tmp_path: Path) -> None:
    port = free_port()
    specs = [
        ProcessSpec(
            name="api",
            role="api",
            port=port,
            command=[sys.executable, "-c", SERVER, str(port)],
            readiness=TcpProbe(port=port, period=0.05),
        ),
        ProcessSpec(
            name="worker",
            role="env",
            command=[sys.executable, "-c", "import time; time.sleep(600)"],
            depends_on={"api": {"condition": "process_healthy"}},
        ),
    ]
    run_dir = tmp_path / "run"
    supervisor = Supervisor(specs, run_dir)
    runner = asyncio.create_task(supervisor.run())
    try:
        deadline = time.monotonic() + 20
        while supervisor.status()["worker"].state != State.RUNNING:
            assert time.monotonic() < deadline, supervisor.status()
            await asyncio.sleep(0.05)
    finally:
        await supervisor.shutdown("test done")
        await runner

    with (run_dir / "events.jsonl").open("a") as journal:
        journal.write('{"type": "ProcessPlanned", "process": "cut short"}\n')
    state, bad = load_run(run_dir)
    assert bad == 1
    assert list(state.processes) == ["api", "worker"]
    api, worker = state.processes["api"], state.processes["worker"]
    assert (api.role, api.port, api.state) == ("api", port, State.STOPPED)
    assert (worker.role, worker.port) == ("env", None)

    app = GrpoTuiApp(state, keymap_path=tmp_path / "none.toml")
    async with app.run_test(size=(160, 48)):
        table = app.screen.query_one(ProcessTable)
        assert table.get_cell("api", "name").plain == "api"  # its role is its name
        assert table.get_cell("api", "port").plain == str(port)
        assert table.get_cell("worker", "name").plain == "worker env"  # name, then role
