"""A server attached by URL (issue 37) in the process table: ``external`` where the pid
goes, its URL where the port goes, its health as probed; the same from ``events.jsonl``
alone (``grpo-tui view``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from grpo_tui.run_files import load_run
from grpo_tui.supervisor.events import ProcessPlanned, State, StateChanged
from grpo_tui.widgets.process_table import row_cells

URL = "http://gpu-node:9001"


def journal(run_dir: Path, *events: ProcessPlanned | StateChanged) -> None:
    run_dir.mkdir()
    lines = [json.dumps(event.to_json(), default=str) for event in events]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")


def test_an_external_server_shows_its_url_and_no_pid_from_the_journal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    journal(
        run_dir,
        ProcessPlanned(
            process="inference", role="inference", port=None, command=("a",), external=URL
        ),
        ProcessPlanned(process="trainer", role="trainer", port=None, command=("t",)),
        StateChanged(process="inference", old=State.STARTING, new=State.READY, pid=4242),
        StateChanged(process="trainer", old=State.STARTING, new=State.READY, pid=4343),
    )
    state, bad = load_run(run_dir)
    assert bad == 0
    inference, trainer = state.processes["inference"], state.processes["trainer"]
    assert (inference.external, trainer.external) == (URL, None)
    inference.health = "ok"
    cells = {key: cell.plain for key, cell in row_cells(inference, time.time()).items()}
    assert (cells["name"], cells["state"], cells["pid"]) == ("inference", "ready", "external")
    assert (cells["health"], cells["port"]) == ("ok", "gpu-node:9001"), cells
    assert "4242" not in cells.values(), "a pid shown for a process that is not ours"
    assert row_cells(trainer, time.time())["pid"].plain == "4343"
