"""The sweep screen and the HTML report over a real (cheap) sweep directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sweep_cheap import REPO, run_sweep, write_profile

from grpo_tui.screens.sweep import SweepScreen
from grpo_tui.sweep.report import write_report
from grpo_tui.sweep.store import SweepDir
from grpo_tui.sweep_app import SweepApp

CELLS = ["0-SCALE0.3", "1-SCALE0.9", "2-SCALE0.6"]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sweep")
    done = run_sweep(write_profile(tmp), tmp / "sweep", "--parallel", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "sweep"


async def test_rows_per_cell_sort_by_reward_and_reverse(sweep_dir: Path) -> None:
    app = SweepApp(SweepDir(sweep_dir), runner=None, threshold=0.5)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        assert screen.row_ids() == CELLS  # sweep order: sorted by cell id
        rewards = {s.id: s.reward for s in screen.summaries}
        # the 5-step window of 6 steps of reward scale*step/6: scale * (2+3+4+5+6)/30
        assert rewards == pytest.approx({"0-SCALE0.3": 0.2, "1-SCALE0.9": 0.6, "2-SCALE0.6": 0.4})
        assert {s.state for s in screen.summaries} == {"done"}
        assert {s.step for s in screen.summaries} == {6}
        reward_column = [label for label, _ in screen.columns].index("reward(5)")
        while screen.sort_column != reward_column:
            await pilot.press("s")
        assert screen.row_ids() == ["0-SCALE0.3", "2-SCALE0.6", "1-SCALE0.9"]
        await pilot.press("S")
        assert screen.row_ids() == ["1-SCALE0.9", "2-SCALE0.6", "0-SCALE0.3"]
        # threshold 0.5 on the 5-step mean: scale 0.9 reaches it at step 6 (mean 0.6; at step
        # 5 the mean is 0.45), scale 0.6 tops out at 0.4
        reached = {s.id: s.threshold_step for s in screen.summaries}
        assert reached == {"0-SCALE0.3": None, "1-SCALE0.9": 6, "2-SCALE0.6": None}
        await pilot.press("m")
        assert screen.metric == "kl"
        chart_title = str(screen.query_one("#chart-sweep").border_title)
        assert chart_title.startswith("kl")
        await pilot.press("q")


def test_report_has_the_table_and_one_curve_per_cell(sweep_dir: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "report", str(sweep_dir), "--threshold", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    html = (sweep_dir / "report.html").read_text()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")
    for cell in CELLS:
        assert html.count(f">{cell}</td>") == 1
    charts = re.findall(r"<svg .*?</svg>", html)
    assert len(charts) == 3  # reward/mean, kl, loss
    assert all(chart.count("<polyline") == 3 for chart in charts)
    run = write_report(sweep_dir / CELLS[1], sweep_dir / "run.html", threshold=0.5)
    assert run.read_text().count("<polyline") == 3  # one run: one curve per metric
    with pytest.raises(ValueError, match="neither a sweep directory nor a run directory"):
        write_report(sweep_dir / "console", sweep_dir / "bad.html", threshold=0.5)
