"""The rollout inspector (``g``): the groups the trainer trained on and the all-equal groups
the environments dropped, newest first, and one group in full.

Reads the run's ``rollouts/`` records (``grpo_trainer/records``) once a second while on top:
only what was appended since is read, and only the open group's record is decoded. ``/``
filters (``kind=dropped env=gsm8k step=40..60 lag>=2 reward<0.5``), ``v`` cycles all /
trained / dropped, ←/→ picks a completion, ``c`` colours its tokens by the trainer-vs-
inference logprob difference, the entropy, the importance ratio or the logprob.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import ClassVar

from rich.markup import escape
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Input, Static

from grpo_trainer.records.query import GroupFilter, parse_filter, select
from grpo_trainer.records.rollout_reader import RecordGone, RolloutIndex
from grpo_trainer.records.rollouts import KINDS, GroupRecord
from grpo_tui.rollout_view import MEASURES
from grpo_tui.screens.host import DashboardHost
from grpo_tui.widgets.group_detail import GroupDetail
from grpo_tui.widgets.group_list import HEADER, GroupList
from grpo_tui.widgets.key_bar import KeyBar

POLL_PERIOD = 1.0
KIND_CYCLE = (None, *KINDS)


class InspectorScreen(Screen[None]):
    """Browse the run's recorded groups."""

    app: DashboardHost

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", id="rollouts-filter"),
        Binding("v", "next_kind", "Kind", id="rollouts-kind"),
        Binding("c", "next_measure", "Colour", id="rollouts-colour"),
        Binding(
            "left", "completion(-1)", "Previous completion", show=False, id="rollouts-previous"
        ),
        Binding("right", "completion(1)", "Next completion", show=False, id="rollouts-next"),
        Binding("escape", "escape", "Back", show=False, id="rollouts-escape"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.index: RolloutIndex | None = None
        self.filter = GroupFilter()
        self.measure = "delta"
        self.record: GroupRecord | None = None
        self.selected = 0
        self.open_ms = 0.0
        """How long the last group took to read, decode and draw."""
        self._problem = ""

    def compose(self) -> ComposeResult:
        yield Static(id="inspector-summary")
        yield Input(
            placeholder="filter, e.g. kind=dropped env=toy lag>=1 (enter, escape)",
            id="inspector-filter",
        )
        with Horizontal(id="inspector-body"):
            with Vertical(id="inspector-list"):
                yield Static(HEADER, id="inspector-header")
                yield GroupList(id="groups")
            yield GroupDetail(id="group-detail")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one(Input).display = False
        run_dir = self.app.state.run_dir
        self.index = RolloutIndex(run_dir) if run_dir is not None else None
        self.refresh_groups()
        self.query_one(GroupList).focus()
        self.set_interval(POLL_PERIOD, self.poll)

    def poll(self) -> None:
        """Read what the run appended (only while on top)."""
        if self.is_active and self.index is not None and self.index.poll():
            self.refresh_groups(poll=False)

    def refresh_groups(self, *, poll: bool = True) -> None:
        """Apply the filter to the index and redraw the list and the summary."""
        if self.index is None:
            self._summary("no run directory: nothing recorded to show")
            return
        if poll:
            self.index.poll()
        rows = select(self.index, self.filter)
        self.query_one(GroupList).show(self.index, rows)
        kinds = self.index.rows["kind"][self.index.groups()]
        counts = " · ".join(f"{int((kinds == i).sum()):,} {kind}" for i, kind in enumerate(KINDS))
        self._summary(
            f"[b]rollouts[/b] {counts} · [b]{escape(self.filter.describe())}[/b]: {len(rows):,}"
            f" · colour: {MEASURES[self.measure]}"
        )

    def _summary(self, text: str) -> None:
        problem = f"  [b red]{escape(self._problem)}[/]" if self._problem else ""
        self.query_one("#inspector-summary", Static).update(text + problem)

    @on(GroupList.Highlighted)
    def open_group(self, event: GroupList.Highlighted) -> None:
        started = time.perf_counter()
        if event.row is None or self.index is None:
            self.record = None
            note = "no group matches the filter" if self.index else "nothing recorded"
            self.query_one(GroupDetail).show(None, 0, self.measure, note)
            return
        try:
            self.record = self.index.open(event.row)
        except (RecordGone, OSError, ValueError) as error:
            self.record = None
            self.query_one(GroupDetail).show(None, 0, self.measure, f"cannot open: {error}")
            return
        self.selected = min(self.selected, len(self.record.completions) - 1)
        self._draw_detail()
        self.open_ms = (time.perf_counter() - started) * 1000

    def _draw_detail(self) -> None:
        self.query_one(GroupDetail).show(self.record, self.selected, self.measure)

    def action_completion(self, by: int) -> None:
        if self.record is not None:
            self.selected = (self.selected + by) % len(self.record.completions)
            self._draw_detail()

    def action_next_measure(self) -> None:
        names = list(MEASURES)
        self.measure = names[(names.index(self.measure) + 1) % len(names)]
        self.refresh_groups(poll=False)
        self._draw_detail()

    def action_next_kind(self) -> None:
        kind = KIND_CYCLE[(KIND_CYCLE.index(self.filter.kind) + 1) % len(KIND_CYCLE)]
        self.filter = replace(self.filter, kind=kind)
        self.refresh_groups(poll=False)

    def action_filter(self) -> None:
        box = self.query_one(Input)
        box.value = "" if self.filter == GroupFilter() else self.filter.describe()
        box.display = True
        box.focus()

    @on(Input.Submitted, "#inspector-filter")
    def apply_filter(self, event: Input.Submitted) -> None:
        try:
            self.filter = parse_filter(event.value)
        except ValueError as error:
            self._problem = str(error)
        else:
            self._problem = ""
            event.input.display = False
            self.query_one(GroupList).focus()
        self.refresh_groups(poll=False)

    def action_escape(self) -> None:
        box = self.query_one(Input)
        if box.display:
            box.display = False
            self._problem = ""
            self.query_one(GroupList).focus()
            self.refresh_groups(poll=False)
        else:
            self.app.action_show_dashboard()
