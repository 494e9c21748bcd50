"""Charts label what they show: integer steps, a readable range for one point or a constant,
and one unit per chart (pilot on a live RunState)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.text import Text

from grpo_tui.app import GrpoTuiApp
from grpo_tui.run_state import RunState
from grpo_tui.screens.dashboard import DashboardScreen
from grpo_tui.supervisor.events import GpuSample, MetricsRecord, ResourceSample
from grpo_tui.widgets.gpu_table import GpuTable, gpu_table
from grpo_tui.widgets.metric_chart import DASHBOARD_CHARTS, MetricChart

T0 = 1_800_000_000.0
SIZE = (160, 48)


async def draw(state: RunState) -> dict[str, tuple[str, str, str]]:
    """Each chart's (title, x-axis labels, y-axis labels) once drawn."""
    app = GrpoTuiApp(state, clock=lambda: T0 + 5, keymap_path=Path("/nonexistent/keymap"))
    async with app.run_test(size=SIZE) as pilot:
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen)
        for chart in dashboard.query(MetricChart):
            chart.redraw(state.metrics)
        await pilot.pause()
        return {
            chart.spec.id: (
                Text.from_markup(str(chart.border_title)).plain,
                *chart.axis_text,
            )
            for chart in dashboard.query(MetricChart)
        }


async def test_one_point_and_a_constant_series_get_integer_steps_and_a_real_range() -> None:
    state = RunState("charts", started_at=T0)
    state.apply(MetricsRecord(t=T0 + 1, process="trainer", step=1, data={"loss": 0.0}))
    for step in (1, 2, 3):
        data = {"mean_ratio": 1.0, "clipped_fraction": 0.0}
        state.apply(MetricsRecord(t=T0 + step, process="trainer", step=step, data=data))
    charts = await draw(state)

    title, x_axis, y_axis = charts["loss"]
    assert title == "loss 0"
    assert "0.99" not in x_axis and "1.00" not in x_axis
    assert x_axis.split() == ["0", "1", "2"]
    assert "-0.0" not in y_axis and "0.0000" not in y_axis
    assert {float(label) for label in y_axis.split()} >= {-1.0, 0.0, 1.0}

    _, x_axis, y_axis = charts["mean_ratio"]
    assert x_axis.split() == ["1", "2", "3"]
    ticks = [float(label) for label in y_axis.split()]
    assert min(ticks) <= 0.8 and max(ticks) >= 1.1  # the band lines 0.8 / 1.2 set the range
    _, x_axis, y_axis = charts["clipped_fraction"]
    assert x_axis.split() == ["1", "2", "3"]
    assert "-0.0" not in y_axis


async def test_memory_chart_has_one_unit_gpu_memory_or_rss() -> None:
    state = RunState("memory", started_at=T0)
    state.apply(ResourceSample(t=T0 + 1, process="api", cpu_percent=1.0, rss_bytes=50 * 2**20))
    charts = await draw(state)
    assert charts["memory"][0] == "RSS: api 50 MB"

    state.apply(
        GpuSample(
            t=T0 + 2,
            index=0,
            name="H100",
            memory_used_bytes=12_500_000_000,
            memory_total_bytes=80_000_000_000,
            utilization_percent=50.0,
        )
    )
    charts = await draw(state)
    assert charts["memory"][0] == "GPU memory: 0 12.5 GB"
    assert "MB" not in charts["memory"][0]


async def test_gpu_table_shows_holders_memory_and_utilisation_and_hides_without_gpus() -> None:
    state = RunState("gpus", started_at=T0)
    app = GrpoTuiApp(state, clock=lambda: T0 + 5, keymap_path=Path("/nonexistent/keymap"))
    async with app.run_test(size=SIZE) as pilot:
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen)
        table = dashboard.query_one(GpuTable)
        dashboard.redraw()
        await pilot.pause()
        assert not table.display, "no GPU sampled: no GPU table"
        for index, holders in enumerate([("trainer",), ("trainer",), ("inference",), ()]):
            state.apply(
                GpuSample(
                    t=T0 + 1,
                    index=index,
                    name="H200",
                    memory_used_bytes=(index + 1) * 10_000_000_000,
                    memory_total_bytes=140_000_000_000,
                    utilization_percent=25.0 * index,
                    holders=holders,
                )
            )
        dashboard.redraw()
        await pilot.pause()
        assert table.display
        assert table.region.height == 2 + 2, "four GPUs: two lines, two per line, and a border"
    console = Console(width=150, record=True)
    console.print(gpu_table(state.gpus))
    lines = [line.split() for line in console.export_text().splitlines()]
    assert lines[0][:5] == ["GPU", "0", "trainer", "10.0/140", "GB"]
    assert lines[0][6:11] == ["GPU", "1", "trainer", "20.0/140", "GB"]
    assert lines[1][:6] == ["GPU", "2", "inference", "30.0/140", "GB", "50%"]
    assert lines[1][6:9] == ["GPU", "3", "-"]


async def test_a_chart_out_of_view_is_drawn_when_scrolled_into_view() -> None:
    """At 100x30 most charts are scrolled out: their turns skip them (a third of a redraw's
    CPU), and the scroll key draws those it brings into view with the newest data."""
    state = RunState("scroll", started_at=T0)
    state.apply(MetricsRecord(t=T0 + 1, process="trainer", step=1, data={"sync_time": 0.5}))
    app = GrpoTuiApp(state, clock=lambda: T0 + 5, keymap_path=Path("/nonexistent/keymap"))
    async with app.run_test(size=(100, 30)) as pilot:
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen)
        await pilot.pause()
        sync = dashboard.query_one("#chart-sync_time", MetricChart)
        assert not sync.region.overlaps(dashboard.query_one("#charts").region)
        state.apply(MetricsRecord(t=T0 + 2, process="trainer", step=2, data={"sync_time": 0.75}))
        for _ in range(len(DASHBOARD_CHARTS)):
            dashboard.redraw_next_charts()
        await pilot.pause()
        assert Text.from_markup(str(sync.border_title)).plain.endswith("0.5")
        for _ in range(4):
            await pilot.press("pagedown")
        await pilot.pause()
        assert sync.region.overlaps(dashboard.query_one("#charts").region)
        assert Text.from_markup(str(sync.border_title)).plain.endswith("0.75")
        assert "2" in sync.axis_text[0].split()
