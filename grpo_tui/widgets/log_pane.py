"""A log pane over one :class:`LogBuffer`: batched writes, follow / pause, a filter.

The pane never sees individual lines as they arrive: :meth:`LogPane.flush` (called every
~80 ms by its screen) copies what is new since the last flush, and at most ``max_lines``
of it, into Textual's ``Log`` widget, which keeps only ``max_lines`` lines itself. Paused,
the view is frozen and the subtitle counts what is waiting; the filter keeps the lines that
contain its text (case-insensitive). One pane can show several streams in turn
(:meth:`LogPane.show`), each keeping its own follow / filter setting.

The view keeps to the newest line until the user scrolls back (:class:`FollowingLog`), and
follows again once scrolled to the end. Lines are folded at the pane's width (``wrap``, the
default), so the end of a long error line is on screen; unwrapped, the pane scrolls
sideways instead.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Log

from grpo_tui.run_state import LogBuffer


class FollowingLog(Log):
    """A ``Log`` that shows its newest line until the user scrolls back, and again once the
    user scrolls to the end.

    Textual's own ``auto_scroll`` follows only while the view is at the end when a line is
    written, which a pane written before its first layout never was: it stayed on its first
    lines for good (the dashboard's events pane at 100x30).
    """

    pinned = True

    def release_anchor(self) -> None:
        """Called by every scroll the user makes (keys, wheel, scrollbar)."""
        super().release_anchor()
        self.pinned = False

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y:
            self.pinned = True

    def follow(self) -> None:
        """Show the newest line (once laid out: a pane written before its layout too)."""
        if self.pinned:
            self.scroll_end(animate=False, x_axis=False)


def fold(lines: Sequence[str], width: int) -> list[str]:
    """``lines`` folded at ``width`` cells: at spaces where it can, inside a word (a long
    path) where it must, continuation lines indented by two."""
    folded: list[str] = []
    for line in lines:
        if len(line) <= width:
            folded.append(line)
        else:
            folded += textwrap.wrap(line, width, subsequent_indent="  ") or [""]
    return folded


def dom_id(prefix: str, name: str) -> str:
    """A valid Textual id for a process name (which may hold dots)."""
    return f"{prefix}-{name.replace('.', '_')}"


class LogPane(Vertical):
    """One process's output (or the supervisor's events)."""

    ALLOW_MAXIMIZE = True

    def __init__(
        self,
        name: str,
        buffer: LogBuffer,
        *,
        max_lines: int = 2000,
        wrap: bool = True,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id or dom_id("log", name), classes="log-pane")
        self.stream = name
        self.buffer = buffer
        self.max_lines = max_lines
        self.wrap = wrap
        self.following = True
        self.needle = ""
        self._seen = 0
        self._start = 0
        """The buffer's total when the pane started showing (:meth:`start_from_now`)."""
        self._settings: dict[str, tuple[bool, str]] = {}
        self._folded_at: int | None = None
        """The width the lines on view were folded at (None: not folded)."""
        self.border_title = name

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter (enter to apply, escape to close)", classes="log-filter")
        yield FollowingLog(max_lines=self.max_lines, auto_scroll=False)

    @property
    def log_view(self) -> FollowingLog:
        return self.query_one(FollowingLog)

    def flush(self) -> int:
        """Write what arrived since the last flush; returns how many lines were written."""
        if not self.following:
            waiting = self.buffer.total - self._seen
            self.border_subtitle = f"paused · {waiting} new lines" if waiting else "paused"
            return 0
        lines, self._seen = self.buffer.since(self._seen)
        if self.needle:
            lines = [line for line in lines if self.needle in line.lower()]
        if not lines:
            return 0
        log = self.log_view
        log.write_lines(self._folded(lines[-self.max_lines :]), scroll_end=False)
        log.follow()
        return len(lines)

    def _folded(self, lines: Sequence[str]) -> Sequence[str]:
        """``lines`` folded at the pane's width when it wraps (and has been laid out)."""
        width = self._fold_width()
        return lines if width is None else fold(lines, width)

    def _fold_width(self) -> int | None:
        width = self.log_view.scrollable_content_region.width
        return width if self.wrap and width >= 20 else None

    def on_resize(self) -> None:
        """Fold again at the new width (the first layout included)."""
        if self.wrap and self._fold_width() != self._folded_at:
            self.reload()

    def toggle_wrap(self) -> None:
        """Fold long lines, or show them whole and scroll sideways."""
        self.wrap = not self.wrap
        self.reload()

    def reload(self) -> None:
        """Redraw from the whole buffer, or what came since :meth:`start_from_now` (after a
        filter change, a resume, a resize)."""
        log = self.log_view
        log.clear()
        self._folded_at = self._fold_width()
        lines, self._seen = self.buffer.since(self._start)
        if self.needle:
            lines = [line for line in lines if self.needle in line.lower()]
        log.write_lines(self._folded(lines[-self.max_lines :]), scroll_end=False)
        log.follow()
        self.border_subtitle = f"filter: {self.needle}" if self.needle else ""

    def show(self, name: str, buffer: LogBuffer) -> None:
        """Show another stream here, with the follow / filter setting it had last time."""
        if name == self.stream and buffer is self.buffer:
            return
        self._settings[self.stream] = (self.following, self.needle)
        self.stream, self.buffer, self._start = name, buffer, 0
        self.following, self.needle = self._settings.get(name, (True, ""))
        self.border_title = name
        self.reload()
        if not self.following:
            self.border_subtitle = "paused"

    def start_from_now(self) -> None:
        """Empty the pane and show only lines that arrive from now on (a resize, which
        folds the lines again, included)."""
        self.log_view.clear()
        self._seen = self._start = self.buffer.total

    def toggle_follow(self) -> None:
        self.following = not self.following
        if self.following:
            self.reload()
        else:
            self.border_subtitle = "paused"

    def open_filter(self) -> None:
        # an inline style takes effect at once, so the field can take focus right away
        # (a class would only apply at the next refresh, and the keys typed meanwhile
        # would reach the app's bindings)
        field = self.query_one(Input)
        field.display = True
        field.focus()

    def close_filter(self) -> None:
        self.query_one(Input).display = False
        self.log_view.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.needle = event.value.strip().lower()
        self.reload()
        self.close_filter()

    @property
    def text(self) -> list[str]:
        """The lines on screen now (for tests and the viewer)."""
        return list(self.log_view.lines)
