"""``grpo-tui profiles/quickstart.toml`` in a real terminal (tmux) of 100x30, end to end.
Slow (e2e).

The quickstart profile is copied with free ports, a temporary output directory (so it
cannot collide with anything else on the machine) and more steps than the test lasts, then
run in a detached tmux session of the smallest size the dashboard must serve: the key bar
must label its keys, the charts must show values, the restart-inference key must restart
inference and the events pane must show that restart (it stayed on its first lines), and
quit, confirmed while the trainer runs, must leave none of the run's processes alive, exit
0 as a run stopped on request does (README, "exit codes"), saying why, and print what
``grpo-tui run`` prints: the run directory and the commands to view and report it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from free_ports import free_port
from required_tools import require

QUICKSTART = Path(__file__).resolve().parents[2] / "profiles" / "quickstart.toml"
DEADLINE = 300.0
STEPS = 100_000
"""Trainer steps of the copy: the run is still training when the test quits it."""
EXITED = re.compile(r"GRPO-TUI-EXITED (\d+)")
GRPO_TUI = Path(sys.executable).with_name("grpo-tui")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def profile_copy(tmp_path: Path) -> Path:
    text = QUICKSTART.read_text()
    text = re.sub(r"(?m)^port = 8000", f"port = {free_port()}", text)
    text = re.sub(r"(?m)^port = 9001", f"port = {free_port()}", text)
    text, found = re.subn(r"(?m)^training_steps = \d+", f"training_steps = {STEPS}", text)
    assert found == 1, "the quickstart's training_steps line moved"
    text = text.replace("[run]\n", f'[run]\noutput_dir = "{tmp_path / "runs"}"\n', 1)
    path = tmp_path / "quickstart.toml"
    path.write_text(text)
    return path


def ours(tmp_path: Path) -> list[psutil.Process]:
    """Processes of this run: their command line names our unique temporary directory."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(tmp_path) in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
    return found


class Terminal:
    def __init__(self, session: str) -> None:
        self.session = session

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout

    @property
    def shell_pid(self) -> int:
        return int(self.tmux("display-message", "-p", "-t", self.session, "#{pane_pid}"))

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def press(self, key: str) -> None:
        self.tmux("send-keys", "-t", self.session, key)

    def wait(self, what: str, predicate: Callable[[str], bool]) -> str:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{self.screen()}")


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    require("tmux")
    session = f"grpo-tui-test-{os.getpid()}"
    command = f"cd {tmp_path} && {GRPO_TUI} {profile_copy(tmp_path)}; echo GRPO-TUI-EXITED $?"
    tmux = Terminal(session)
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30"], check=True
    )
    # size the window before the app starts, whatever tmux's default-size is
    tmux.tmux("resize-window", "-t", session, "-x", "100", "-y", "30")
    tmux.tmux("send-keys", "-t", session, command, "Enter")
    yield tmux
    subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    for proc in ours(tmp_path):  # only after a failure: the test asserts none are left
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def inference_pid(screen: str) -> str | None:
    match = re.search(r"│ inference\s+(\w+)\s+(\d+|-)", screen)
    return match.group(2) if match and match.group(2) != "-" else None


def events_pane(screen: str) -> list[str]:
    """The lines inside the events pane's border."""
    lines = screen.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("╭─ events "))
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("╰"))
    return [line.strip("│ ") for line in lines[top + 1 : bottom]]


KEY_LABELS = (
    "r Restart",
    "x Stop",
    "s Start",
    "K Kill",
    "i Restart inference",
    "m Mode",
    "e Edit",
    "l Logs",
    "g Rollouts",
    "t Timeline",
    "? Help",
    "q Quit",
)


def test_quickstart_dashboard_in_tmux(terminal: Terminal, tmp_path: Path) -> None:
    screen = terminal.wait(
        "loss and reward values on the charts",
        lambda text: (
            re.search(r"loss [-\d.e+]+", text) is not None
            and re.search(r"reward: mean [-\d.e+]+", text) is not None
        ),
    )
    assert "step " in screen and "quickstart-" in screen
    assert "…" not in screen.splitlines()[0], "the header's first line is cut"
    for label in KEY_LABELS:
        assert label in screen, f"key bar without {label!r}:\n{screen}"
    before = terminal.wait("inference running", lambda text: inference_pid(text) is not None)
    old_pid = inference_pid(before)
    terminal.press("i")
    terminal.wait("restart acknowledged", lambda text: "restart inference" in text)
    screen = terminal.wait(
        "inference restarted",
        lambda text: inference_pid(text) not in (None, old_pid),
    )
    new_pid = inference_pid(screen)
    screen = terminal.wait(
        "the events pane showing the restart, the newest events",
        lambda text: any(
            re.search(rf"inference: \w+ -> ready pid {new_pid}\b", line)
            for line in events_pane(text)
        ),
    )
    assert not any("api: pending -> starting" in line for line in events_pane(screen)), (
        "the events pane still shows the run's first events"
    )
    assert ours(tmp_path), "the run's processes should be alive before quitting"
    terminal.press("q")
    terminal.wait("quit confirmation (the trainer runs)", lambda text: "Quit?" in text)
    terminal.press("y")
    screen = terminal.wait("the app exited", lambda text: EXITED.search(text) is not None)
    exited = EXITED.search(screen)
    assert exited is not None and exited.group(1) == "0", f"grpo-tui did not exit 0:\n{screen}"
    (events,) = (tmp_path / "runs").glob("*/events.jsonl")
    printed = "".join(screen.splitlines())  # a long path wraps at 100 columns
    assert f"run dir: {events.parent}" in printed, screen
    assert f"view:    grpo-tui view {events.parent}" in printed, screen
    assert "steps:   " in screen and ", last reward " in screen
    ended = [
        json.loads(line)["message"]
        for line in events.read_text().splitlines()
        if '"run ended: ' in line
    ]
    assert ended == ["run ended: shutdown: quit from the dashboard"], ended
    shell = terminal.shell_pid
    leftovers = [
        p for p in ours(tmp_path) if p.pid != shell and p.is_running() and p.status() != "zombie"
    ]
    assert not leftovers, f"orphans: {[(p.pid, p.cmdline()) for p in leftovers]}"
