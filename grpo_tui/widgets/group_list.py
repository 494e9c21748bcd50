"""The recorded groups as a list, newest first, that draws only the rows on screen.

A run records tens of thousands of groups; a ``DataTable`` would build a row object for
each. This is a line-API scroll view (as Toolong draws huge logs): ``render_line`` formats
the few visible rows straight from the index's numpy arrays, so a list of a hundred
thousand groups scrolls like one of ten. The cursor stays on its group while new groups
arrive above it, unless it is on the newest, where it follows.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from grpo_trainer.records.rollout_reader import RolloutIndex
from grpo_trainer.records.rollouts import KINDS, NO_LAG

HEADER = " step kind    env     reward lag  len     kl"
KIND_STYLES = {"trained": "green", "dropped": "yellow"}


def row_text(index: RolloutIndex, row: int) -> Text:
    """One group's summary line (the columns of :data:`HEADER`: mean reward, lag, mean
    completion length, mean mismatch k3 over its tokens)."""
    r = index.rows[row]
    kind = KINDS[int(r["kind"])]
    lag = "-" if int(r["lag"]) == NO_LAG else str(int(r["lag"]))
    kl = float(r["mismatch_kl"])
    return Text.assemble(
        f"{int(r['step']):>5} ",
        (f"{kind:<7} ", KIND_STYLES[kind]),
        f"{index.env_name(row)[:7]:<7} {float(r['reward_mean']):>6.3f} {lag:>3} ",
        f"{float(r['length_mean']):>4.0f} ",
        "     -" if math.isnan(kl) else f"{kl:>6.4f}",
    )


class GroupList(ScrollView, can_focus=True):
    """Rows of an index (``show``); posts :class:`GroupList.Highlighted` as the cursor moves."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "Newest", show=False),
        Binding("end", "jump(-1)", "Oldest", show=False),
    ]

    DEFAULT_CSS = """
    GroupList {
        background: $surface;
    }
    """

    class Highlighted(Message):
        """The cursor is on index row ``row`` (None: the list is empty)."""

        def __init__(self, row: int | None) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.index: RolloutIndex | None = None
        self.rows = np.zeros(0, np.int64)
        self.cursor = 0
        self._highlighted: int | None = -1  # nothing announced yet

    def show(self, index: RolloutIndex, rows: np.ndarray) -> None:
        """Show ``rows`` (index row numbers, newest first), keeping the cursor's group."""
        current = self.current
        self.index, self.rows = index, rows
        if current is not None and self.cursor > 0:
            found = np.flatnonzero(rows == current)
            self.cursor = int(found[0]) if len(found) else min(self.cursor, len(rows) - 1)
        else:
            self.cursor = 0
        self.cursor = max(0, min(self.cursor, len(rows) - 1))
        self.virtual_size = Size(len(HEADER), len(rows))
        self._scroll_to_cursor()
        self.refresh()
        self._announce()

    @property
    def current(self) -> int | None:
        """The index row under the cursor."""
        return int(self.rows[self.cursor]) if len(self.rows) else None

    def _announce(self) -> None:
        if self.current != self._highlighted:
            self._highlighted = self.current
            self.post_message(self.Highlighted(self.current))

    def _scroll_to_cursor(self) -> None:
        height = max(1, self.scrollable_content_region.height)
        top = self.scroll_offset.y
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False)

    def action_move(self, by: int) -> None:
        self.cursor = max(0, min(len(self.rows) - 1, self.cursor + by))
        self._scroll_to_cursor()
        self.refresh()
        self._announce()

    def action_page(self, pages: int) -> None:
        self.action_move(pages * max(1, self.scrollable_content_region.height - 1))

    def action_jump(self, where: int) -> None:
        self.action_move((len(self.rows) if where < 0 else -len(self.rows)) * 2)

    def render_line(self, y: int) -> Strip:
        line = self.scroll_offset.y + y
        width = self.scrollable_content_region.width
        if self.index is None or line >= len(self.rows):
            return Strip.blank(width, self.rich_style)
        text = row_text(self.index, int(self.rows[line]))
        text.truncate(width, pad=True)
        if line == self.cursor:
            text.stylize(Style(reverse=True) if self.has_focus else Style(bgcolor="grey30"))
        segments = list(text.render(self.app.console))
        return Strip(Segment.apply_style(segments, self.rich_style), width)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def on_click(self, event: object) -> None:
        y = getattr(event, "y", None)
        if y is not None and self.rows.size:
            self.cursor = max(0, min(len(self.rows) - 1, self.scroll_offset.y + int(y)))
            self.refresh()
            self._announce()
