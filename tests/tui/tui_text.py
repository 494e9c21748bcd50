"""What a widget shows, as plain text, for assertions."""

from __future__ import annotations

import io

from rich.console import Console
from textual.widgets import Static


def plain(static: Static, width: int = 160) -> str:
    """The text of a static's content (a string with markup or a Rich renderable)."""
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(static.content)
    return console.export_text()
