"""The step timeline (``t``): per step, each process's phases (each rank's, for a trainer on
several GPUs) as bars on one time axis, and where the selected step's time went.

Reads the run's ``timeline/`` records (``grpo_trainer/records/timeline.py``) and redraws
twice a second while on top. ←/→ select a step, ``+``/``-`` show more or fewer steps around
it, ``a`` the whole run, ``end`` follows the newest step again.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from grpo_trainer.records.timeline_reader import Timeline
from grpo_tui.screens.host import DashboardHost
from grpo_tui.timeline_view import breakdown_table, chart, legend
from grpo_tui.widgets.key_bar import KeyBar

REDRAW_PERIOD = 0.5
ZOOMS = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
"""Steps shown at once, ``+`` / ``-`` move through these; ``a``: all of them."""
DEFAULT_ZOOM = 3


class TimelineScreen(Screen[None]):
    """Where the run's time goes, step by step."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "step(-1)", "Previous step", show=False, id="timeline-previous"),
        Binding("right", "step(1)", "Next step", show=False, id="timeline-next"),
        Binding("plus,equals_sign", "zoom(1)", "More steps", id="timeline-zoom-out"),
        Binding("minus", "zoom(-1)", "Fewer steps", id="timeline-zoom-in"),
        Binding("a", "all_steps", "All steps", id="timeline-all"),
        Binding("end", "follow", "Newest", id="timeline-follow"),
        Binding("escape", "back", "Back", show=False, id="timeline-escape"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.timeline: Timeline | None = None
        self.selected: int | None = None
        """The step whose breakdown is shown (None: follow the newest)."""
        self.zoom = DEFAULT_ZOOM
        self.all_steps = False
        self._drawn: tuple[object, ...] | None = None
        """What the last redraw showed: a redraw that would show the same is skipped."""

    def compose(self) -> ComposeResult:
        yield Static(id="timeline-summary")
        with VerticalScroll(id="timeline-body"):
            yield Static(id="timeline-chart")
            yield Static(legend(), id="timeline-legend")
            yield Static(id="timeline-breakdown")
        yield KeyBar()

    def on_mount(self) -> None:
        run_dir = self.app.state.run_dir
        self.timeline = Timeline(run_dir) if run_dir is not None else None
        self.call_after_refresh(self.redraw, force=True)  # once laid out: the chart's width
        self.set_interval(REDRAW_PERIOD, self.redraw)

    def shown_steps(self) -> list[int]:
        """The steps in the window: ``zoom`` steps ending at the selected one (or all)."""
        assert self.timeline is not None
        steps = self.timeline.steps()
        if self.all_steps or not steps:
            return steps
        last = steps.index(self.current_step) + 1 if self.current_step in steps else len(steps)
        return steps[max(0, last - self.zoom) : last]

    @property
    def current_step(self) -> int | None:
        steps = self.timeline.steps() if self.timeline is not None else []
        if self.selected is not None and self.selected in steps:
            return self.selected
        return steps[-1] if steps else None

    def redraw(self, *, force: bool = False) -> None:
        """Read new spans and draw (only while on top; ``force``: after a key)."""
        if not (self.is_active or force):
            return
        summary = self.query_one("#timeline-summary", Static)
        if self.timeline is None:
            summary.update("no run directory: nothing recorded to show")
            return
        new = self.timeline.poll()
        steps = self.shown_steps()
        if not steps:
            summary.update("timeline: no step recorded yet (the trainer writes a line per step)")
            return
        current = self.current_step
        assert current is not None
        width = self.query_one("#timeline-chart", Static).size.width or self.size.width
        drawn = (steps[0], steps[-1], current, width, len(self.timeline.lanes))
        if not new and not force and drawn == self._drawn:
            return
        relayout = self._drawn is None or drawn[-1] != self._drawn[-1]  # lanes came
        self._drawn = drawn
        all_steps = self.timeline.steps()
        follow = "following the newest" if self.selected is None else "end: follow the newest"
        summary.update(
            f"[b]timeline[/b] steps {all_steps[0]}-{all_steps[-1]} · showing "
            f"{steps[0]}-{steps[-1]} · step [b]{current}[/b] · {follow} · "
            f"←/→ step, +/- zoom, a all"
        )
        self.query_one("#timeline-chart", Static).update(
            chart(self.timeline, steps, width, current), layout=relayout
        )
        self.query_one("#timeline-breakdown", Static).update(
            breakdown_table(self.timeline, current), layout=relayout
        )

    def action_step(self, by: int) -> None:
        if self.timeline is None or self.current_step is None:
            return
        steps = self.timeline.steps()
        index = max(0, min(len(steps) - 1, steps.index(self.current_step) + by))
        self.selected = steps[index] if index < len(steps) - 1 else None
        self.all_steps = False
        self.redraw(force=True)

    def action_zoom(self, by: int) -> None:
        at = ZOOMS.index(self.zoom) if self.zoom in ZOOMS else 2
        self.zoom = ZOOMS[max(0, min(len(ZOOMS) - 1, at + by))]
        self.all_steps = False
        self.redraw(force=True)

    def action_all_steps(self) -> None:
        self.all_steps = True
        self.redraw(force=True)

    def action_follow(self) -> None:
        self.selected = None
        self.all_steps = False
        self.redraw(force=True)

    def action_back(self) -> None:
        self.app.action_show_dashboard()
