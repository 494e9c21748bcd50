"""The quick-Esc input driver on a real pseudo-terminal: keys and escape sequences still parse.

The driver replaces Textual's input loop (to deliver a lone Esc sooner; the latency itself
is measured by benchmarks/tui.py), so this drives a small app through a pty, as a
terminal would, and checks every kind of input arrives as the right key.
"""

from __future__ import annotations

import inspect
import os
import pty
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from grpo_tui.app import GrpoTuiApp
from grpo_tui.driver import QuickEscapeDriver
from grpo_tui.run_state import RunState

DEADLINE = 20.0
APP = """
import sys
from grpo_tui.terminal import prefer_quick_escape
prefer_quick_escape()
from textual.app import App
from grpo_tui.driver import QuickEscapeDriver

class Keys(App[None]):
    def on_mount(self) -> None:
        self.log_file = open(sys.argv[1], "a", buffering=1)
        self.log_file.write("ready\\n")

    def on_key(self, event) -> None:
        self.log_file.write(event.key + "\\n")
        if event.key == "q":
            self.exit()

Keys(driver_class=QuickEscapeDriver).run()
"""


def test_the_app_uses_it_on_linux() -> None:
    assert GrpoTuiApp(RunState("r")).driver_class is QuickEscapeDriver


@pytest.mark.timeout(60)
def test_keys_escape_and_sequences_arrive_through_a_pty(tmp_path: Path) -> None:
    script = tmp_path / "keys_app.py"
    script.write_text(APP)
    keys_file = tmp_path / "keys.txt"
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
    env.pop("ESCDELAY", None)
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, str(script), str(keys_file)], env)

    def keys() -> list[str]:
        return keys_file.read_text().split() if keys_file.exists() else []

    def wait_for(what: str, predicate: Callable[[], bool]) -> None:
        """Drain the app's output (so it never blocks on a full pty) until ``predicate``."""
        deadline = time.monotonic() + DEADLINE
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {keys()}"
            if select.select([fd], [], [], 0.05)[0]:
                try:
                    os.read(fd, 65536)
                except OSError:
                    break

    try:
        wait_for("the app", lambda: keys()[:1] == ["ready"])
        os.write(fd, b"\x1b")
        wait_for("escape", lambda: keys()[1:] == ["escape"])
        os.write(fd, b"\x1b[A")
        wait_for("up", lambda: keys()[2:] == ["up"])
        os.write(fd, b"x\x1b[B\x1b")
        wait_for("x, down, escape", lambda: keys()[3:] == ["x", "down", "escape"])
        os.write(fd, b"q")
        wait_for("q", lambda: keys()[-1:] == ["q"])
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def test_textuals_input_loop_is_still_the_one_the_driver_copies() -> None:
    """``QuickEscapeDriver.run_input_thread`` is Textual 8.2.8's loop with one wait changed
    (``grpo_tui/driver.py`` says why no public way exists). A Textual whose loop differs
    fails here: copy its new loop (and its parser's use) before widening the pin."""
    from textual.drivers.linux_driver import LinuxDriver

    upstream = inspect.getsource(LinuxDriver.run_input_thread)
    for part in (
        "selectors.SelectSelector()",
        "XTermParser(self._debug)",
        "getincrementaldecoder(\"utf-8\")().decode",
        "read(fileno, 1024 * 4)",
        "process_selector_events(selector.select(0.1))",
        "process_selector_events(selector.select(0.1), final=True)",
        "except (EOFError, ParseError):",
    ):
        assert part in upstream, f"Textual's input loop changed: no {part!r}"
    assert upstream.count("self.process_message(event)") == 2
