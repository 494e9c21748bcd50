"""Textual's Linux driver, delivering a lone Esc after ``ESCDELAY`` instead of ~100 ms later.

Textual's input thread waits on stdin with a fixed 0.1 s ``select`` timeout and looks at
the escape-sequence parser's timeout only when a wait ends, so a lone Esc (which could be
the start of a sequence) reaches the app about 100 ms after the key press whatever
``ESCDELAY`` says: on its own, slower than the dashboard's 100 ms key target. This is the
input loop of Textual 8.2.8 with that wait shortened to ``ESCDELAY`` (see
:mod:`grpo_tui.terminal`). Terminals that speak the kitty keyboard protocol, which
Textual turns on, send Esc unambiguously and never waited.

Why private modules (``textual._parser``, ``textual._xterm_parser``): Textual offers no
public way. The wait is a literal in ``LinuxDriver.run_input_thread``
(``selector.select(0.1)``), with no attribute, option or hook to change it, and the loop
builds its own ``XTermParser``; a subclass can only replace the whole loop, which needs the
parser. Upstream made the Esc delay configurable (``ESCDELAY``, Textualize/textual PR #4848,
Textual 0.76) but left that wait fixed, and no issue or PR asks for it as of 8.2.8 (searched
2026-11-29). So pyproject.toml pins Textual to 8.2.x (``>=8.2.8,<8.3``), and
``tests/tui/test_tui_driver.py`` checks that Textual's loop is still the one copied here.
"""

from __future__ import annotations

import os
import selectors
from codecs import getincrementaldecoder

from textual import constants
from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.drivers.linux_driver import LinuxDriver

MAX_POLL = 0.1
"""Textual's own wait: how often the thread looks at the exit flag at the least."""


class QuickEscapeDriver(LinuxDriver):
    """:class:`LinuxDriver` whose input thread checks the parser every ``ESCDELAY`` seconds."""

    def run_input_thread(self) -> None:
        """Read stdin and dispatch events (Textual's loop, with a shorter wait)."""
        poll = min(MAX_POLL, constants.ESCAPE_DELAY)
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode

        def process(ready: list[tuple[selectors.SelectorKey, int]], final: bool = False) -> None:
            for index, (_key, mask) in enumerate(ready):
                if mask & selectors.EVENT_READ:
                    last = index == len(ready) - 1
                    data = decode(os.read(self.fileno, 4096), final=final and last)
                    if not data:
                        break  # stdin is a pipe that was closed
                    for event in parser.feed(data):
                        self.process_message(event)
            for event in parser.tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                process(selector.select(poll))
            selector.unregister(self.fileno)
            process(selector.select(poll), final=True)
        finally:
            selector.close()
            try:
                for _event in parser.feed(""):
                    pass
            except (EOFError, ParseError):
                pass
