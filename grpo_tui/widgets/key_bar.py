"""The key bar: the screen's keys on one line, each clickable; a one-widget footer.

Textual's ``Footer`` is a widget per key and recomposes itself every time its screen is
shown, which was about half the cost of switching between the dashboard and the logs. This
draws the same keys in the same colours (after the user's keymap, hidden when
``check_action`` says so, dimmed when disabled, the command palette on the right) as one
line, redrawn only when the keys change. Every key stays on the bar: where the full
descriptions do not fit one line (a 100-column terminal) the bar takes two or three, and
only where three do not hold them are the descriptions cut to the longest length that fits.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

from rich.style import Style
from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widget import Widget


class ShownKey(NamedTuple):
    """One key as the bar shows it."""

    key: str
    display: str
    description: str
    enabled: bool


def shown_keys(screen: Screen[object]) -> tuple[ShownKey, ...]:
    """The first binding of each action the screen would show (``show=True``), in order."""
    app = screen.app
    keys: dict[str, ShownKey] = {}
    for active in screen.active_bindings.values():
        binding = active.binding
        if binding.show and binding.action not in keys:
            display = app.get_key_display(binding)
            keys[binding.action] = ShownKey(
                binding.key, display, binding.description, active.enabled
            )
    return tuple(keys.values())


def palette_key(screen: Screen[object]) -> ShownKey | None:
    """The command palette's key, when the palette is on."""
    app = screen.app
    active = screen.active_bindings.get(app.COMMAND_PALETTE_BINDING)
    if not app.ENABLE_COMMAND_PALETTE or active is None:
        return None
    return ShownKey(active.binding.key, app.get_key_display(active.binding), "palette", True)


class KeyBar(Widget):
    """The keys of the screen it is docked in, as one line."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "key-bar--key",
        "key-bar--description",
        "key-bar--separator",
    }

    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        background: $footer-background;
        .key-bar--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        .key-bar--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
        .key-bar--separator {
            color: $foreground 20%;
        }
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self._keys: tuple[ShownKey, ...] = ()
        self._palette: ShownKey | None = None
        self._spans: list[tuple[int, int, int, str]] = []
        """(line, start, end, key) of each key drawn, for clicks."""

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self._bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        keys, palette = shown_keys(screen), palette_key(screen)
        if (keys, palette) != (self._keys, self._palette):
            self._keys, self._palette = keys, palette
            self._relayout()
            self.refresh()

    def _draw(
        self, keys: list[tuple[ShownKey, str, str]]
    ) -> tuple[Text, list[tuple[int, int, str]]]:
        """``(key, key text, description text)`` drawn in turn, and where each one landed."""
        text = Text(no_wrap=True, overflow="crop")
        spans = []
        key_style = self.get_component_rich_style("key-bar--key")
        description_style = self.get_component_rich_style("key-bar--description")
        for key, key_text, description_text in keys:
            dim = Style.null() if key.enabled else Style(dim=True)
            start = text.cell_len
            text.append(key_text, key_style + dim)
            text.append(description_text, description_style + dim)
            spans.append((start, text.cell_len, key.key))
        return text, spans

    def _lines(self, width: int) -> list[tuple[Text, list[tuple[int, int, str]]]]:
        """The keys on as few lines as hold them (:data:`LAYOUTS`), with the longest
        descriptions that fit; each line with where its keys landed."""
        palette = self._palette
        right = None if palette is None else self._draw([(palette, palette.display, " palette ")])
        room = max(0, width - (right[0].cell_len + 1 if right else 0))
        for lines, limit in LAYOUTS:
            entries = [
                (key, f" {key.display} ", _cut(key.description, limit)) for key in self._keys
            ]
            rows = _fill(entries, room, lines)
            if rows is not None:
                break
        drawn = [self._draw(row) for row in rows]
        if right is not None:
            text, spans = drawn[-1]
            text.truncate(room, pad=True)
            separator = Text("▏", self.get_component_rich_style("key-bar--separator"))
            shifted = [(start + room + 1, end + room + 1, key) for start, end, key in right[1]]
            drawn[-1] = (Text.assemble(text, separator, right[0]), spans + shifted)
        return drawn

    def _relayout(self) -> None:
        """One line where the keys fit, more where they do not (a 100-column terminal)."""
        height = len(self._lines(self.size.width)) if self.size.width else 1
        if self.styles.height is None or self.styles.height.value != height:
            self.styles.height = height

    def render(self) -> Text:
        lines = self._lines(self.size.width)
        self._spans = [
            (row, start, end, key)
            for row, (_, spans) in enumerate(lines)
            for start, end, key in spans
        ]
        return Text("\n").join(text for text, _ in lines)

    def on_resize(self) -> None:
        self._relayout()
        self.refresh()

    def on_click(self, event: events.Click) -> None:
        """Press the key under the pointer, as Textual's footer does."""
        for row, start, end, key in self._spans:
            if row == event.y and start <= event.x < end:
                self.app.simulate_key(key)


LAYOUTS: tuple[tuple[int, int | None], ...] = (
    (1, None),
    (1, 10),
    (2, None),
    (2, 10),
    (3, None),
    (3, 10),
    (3, 6),
    (3, 0),
)
"""Tried in turn: (lines, description limit). Whole descriptions on one line, a little cut;
then on two lines (the dashboard at 100 columns), then on three (the logs screen's twenty
keys at 100 columns), cut further only where even three do not hold them."""

Entry = tuple[ShownKey, str, str]


def _fill(entries: list[Entry], room: int, lines: int) -> list[list[Entry]] | None:
    """``entries`` in order on at most ``lines`` lines of ``room`` cells (the last line
    forced to take the rest when the keys do not fit even cut to nothing); None: they do
    not fit."""
    rows: list[list[Entry]] = [[]]
    used = 0
    for entry in entries:
        size = len(entry[1]) + len(entry[2])
        if rows[-1] and used + size > room:
            rows.append([])
            used = 0
        rows[-1].append(entry)
        used += size
    if len(rows) <= lines and used <= room:
        return rows
    return None if any(text for _, _, text in entries) else rows[:lines]


def _cut(description: str, limit: int | None) -> str:
    """``description`` and a space in at most ``limit`` characters (0: none): its first
    word where that fits, else its start and an ellipsis."""
    if limit is None or len(description) <= limit:
        return f"{description} "
    if not limit:
        return ""
    first = description.split()[0]
    return f"{first} " if len(first) <= limit else f"{description[: limit - 1]}… "
