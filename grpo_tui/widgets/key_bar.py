"""The key bar: the screen's keys on one line, each clickable; a one-widget footer.

Textual's ``Footer`` is a widget per key and recomposes itself every time its screen is
shown, which was about half the cost of switching between the dashboard and the logs. This
draws the same keys in the same colours (after the user's keymap, hidden when
``check_action`` says so, dimmed when disabled, the command palette on the right) as one
line, redrawn only when the keys change. Every key stays on the line: where the full
descriptions do not fit (a 100-column terminal) they are cut to the longest length that
fits, down to the bare keys.
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
        self._spans: list[tuple[int, int, str]] = []
        """(start, end, key) of each key drawn, for clicks."""

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self._bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        keys, palette = shown_keys(screen), palette_key(screen)
        if (keys, palette) != (self._keys, self._palette):
            self._keys, self._palette = keys, palette
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

    def _keys_text(self, room: int) -> tuple[Text, list[tuple[int, int, str]]]:
        """The keys with the longest descriptions that fit in ``room`` cells."""
        for limit in (None, 10, 8, 6, 5, 4, 3, 0):
            drawn = self._draw(
                [(key, f" {key.display} ", _cut(key.description, limit)) for key in self._keys]
            )
            if drawn[0].cell_len <= room:
                break
        return drawn

    def render(self) -> Text:
        palette_width = 0 if self._palette is None else len(self._palette.display) + 10
        left, self._spans = self._keys_text(max(0, self.size.width - palette_width))
        if self._palette is None:
            return left
        separator = Text("▏", self.get_component_rich_style("key-bar--separator"))
        palette = self._palette
        right, right_spans = self._draw([(palette, palette.display, f" {palette.description} ")])
        room = max(0, self.size.width - right.cell_len - 1)
        left.truncate(room, pad=True)
        self._spans = [span for span in self._spans if span[1] <= room]
        self._spans += [(start + room + 1, end + room + 1, key) for start, end, key in right_spans]
        return Text.assemble(left, separator, right)

    def on_resize(self) -> None:
        self.refresh()

    def on_click(self, event: events.Click) -> None:
        """Press the key under the pointer, as Textual's footer does."""
        for start, end, key in self._spans:
            if start <= event.x < end:
                self.app.simulate_key(key)


def _cut(description: str, limit: int | None) -> str:
    """``description`` and a space in at most ``limit`` characters (0: none): its first
    word where that fits, else its start and an ellipsis."""
    if limit is None or len(description) <= limit:
        return f"{description} "
    if not limit:
        return ""
    first = description.split()[0]
    return f"{first} " if len(first) <= limit else f"{description[: limit - 1]}… "
