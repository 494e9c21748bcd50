"""Terminal input settings the dashboard needs before Textual is imported (no textual here).

A lone Esc byte could be the start of an escape sequence, so Textual waits ``ESCDELAY``
milliseconds (read once, when Textual is imported; 100 by default) before it delivers the
Esc key: every Esc (close a dialog, leave full screen, close the filter) felt that slow.
Escape sequences arrive in one read, so 25 ms is plenty; a user's own ``ESCDELAY`` wins.
The app's input thread (:mod:`grpo_tui.driver`) then looks every ``ESCDELAY`` instead of
every 100 ms.
"""

from __future__ import annotations

import os

ESCAPE_DELAY_MS = 25


def prefer_quick_escape() -> None:
    """Set ``ESCDELAY`` to :data:`ESCAPE_DELAY_MS` unless the user set it; call before Textual."""
    os.environ.setdefault("ESCDELAY", str(ESCAPE_DELAY_MS))
