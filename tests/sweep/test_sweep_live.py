"""The live sweep dashboard: cells run from the app; quitting stops them all in order."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
from sweep_cheap import SCALES, write_profile

from grpo_tui.plan.profile import load_profile
from grpo_tui.sweep.grid import expand, parse_set
from grpo_tui.sweep.runner import EXIT_INTERRUPTED, SweepRunner
from grpo_tui.sweep.store import SweepDir
from grpo_tui.sweep_app import SweepApp


async def test_live_rows_follow_the_cells_and_quit_stops_the_running_ones(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    profile = load_profile(write_profile(tmp_path, {"GATE_DIR": str(gates)}))
    axes = [parse_set("process.work.env.SCALE=" + ",".join(f'"{s}"' for s in SCALES))]
    cells = expand(axes, zipped=False)
    sweep = SweepDir(tmp_path / "sweep")
    record = sweep.create_or_match(profile.path, axes, cells, zipped=False)
    runner = SweepRunner(sweep, record, profile, parallel=3, gpus=[])
    app = SweepApp(sweep, runner=runner, threshold=0.5)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = app.comparison

        async def wait(what: str, condition: object) -> None:
            deadline = time.monotonic() + 60
            while not condition():  # type: ignore[operator]
                assert time.monotonic() < deadline, f"timed out: {what}"
                await pilot.pause(0.05)
                screen.refresh_data()

        def states() -> dict[str, str]:
            return {s.id: str(s.state) for s in screen.summaries}

        await wait("3 cells running", lambda: set(states().values()) == {"running"})
        await wait(
            "every cell's supervisor up",
            lambda: all((sweep.run_dir(c.id) / "events.jsonl").is_file() for c in cells),
        )
        (gates / "0.3").touch()
        await wait("the first cell done", lambda: states()["0-SCALE0.3"] == "done")
        assert screen.row_ids()[0] == "0-SCALE0.3"
        assert {s.id: s.step for s in screen.summaries}["0-SCALE0.3"] == 6
        procs = [
            p
            for proc in runner._procs.values()
            for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
        ]
        assert len(runner._procs) == 2
        await pilot.press("q")
        await wait("the app to exit", lambda: app.return_value is not None)
    assert app.return_value == app.return_code == EXIT_INTERRUPTED
    _, alive = psutil.wait_procs(procs, timeout=30)
    assert not alive, f"cells outlived the dashboard: {alive}"
    final = {k: s.state for k, s in sweep.statuses().items()}
    assert final == {"0-SCALE0.3": "done", "1-SCALE0.9": "failed", "2-SCALE0.6": "failed"}
