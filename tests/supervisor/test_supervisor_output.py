"""Child output: log files keep every byte, events carry lines, slow subscribers never stall."""

from __future__ import annotations

import sys

from conftest import child, spec

from grpo_tui.supervisor.bus import EventBus
from grpo_tui.supervisor.events import LogBatch, Notice, State
from grpo_tui.supervisor.logs import LineSplitter, RotatingLog


async def test_partial_huge_and_binary_lines_reach_the_log_file_intact(supervise) -> None:
    h = supervise([spec("printer", child("printer.py"))], exit_with="printer")
    assert (await h.run_task).exit_code == 0
    expected = (
        b"plain line\n"
        + b"x" * (3 * 1024 * 1024)
        + b"\nbin \xff\xfe\x00 end\n"
        + b"partial, no newline"
    )
    assert (h.sup.run_dir / "logs" / "printer.log").read_bytes() == expected
    lines = [line for e in h.events if isinstance(e, LogBatch) for line in e.lines]
    assert lines[0] == "plain line"
    assert lines[1].startswith("xxxx") and "more bytes in the log file" in lines[1]
    assert lines[2] == "bin \ufffd\ufffd\x00 end"
    assert lines[3] == "partial, no newline"
    assert h.sup.recent_lines("printer")[-1] == "partial, no newline"


def test_line_splitter_keeps_lines_split_across_chunks() -> None:
    splitter = LineSplitter(max_line_chars=8)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\nde") == ["abc"]
    assert splitter.feed(b"f" * 20 + b"\n") == ["deffffff … [14 more bytes in the log file]"]
    assert splitter.close() == []


def test_rotating_log_rotates_at_a_line_boundary(tmp_path) -> None:
    log = RotatingLog(tmp_path / "p.log", max_bytes=10, keep=2)
    for index in range(6):
        log.write(f"line{index}\n".encode())
    log.close()
    files = [tmp_path / "p.log.2", tmp_path / "p.log.1", tmp_path / "p.log"]
    text = b"".join(f.read_bytes() for f in files).decode()
    assert text == "line2\nline3\nline4\nline5\n"  # line0-1 rotated out (keep=2)
    assert all(f.read_bytes().endswith(b"\n") for f in files if f.stat().st_size)
    assert not (tmp_path / "p.log.3").exists()


async def test_slow_subscriber_gets_a_dropped_marker_not_a_stall() -> None:
    bus = EventBus()
    slow = bus.subscribe(max_pending=10)
    fast = bus.subscribe(max_pending=1000)
    for index in range(100):
        bus.publish(LogBatch(process="p", lines=(f"line {index}",)))
    bus.publish(Notice(level="info", message="state changes are never dropped"))
    received = []
    while slow._queue or slow._dropped:
        received.append(await slow.__anext__())
    lines = [line for e in received if isinstance(e, LogBatch) for line in e.lines]
    assert lines == [f"line {i}" for i in range(10)]
    assert sum(e.dropped for e in received if isinstance(e, LogBatch)) == 90
    assert any(isinstance(e, Notice) for e in received)
    bus.publish(LogBatch(process="p", lines=("after",)))
    assert (await slow.__anext__()).lines == ("after",)
    fast_lines = []
    while fast._queue:
        event = await fast.__anext__()
        fast_lines.extend(getattr(event, "lines", ()))
    assert len(fast_lines) == 101
    slow.close()
    fast.close()


async def test_heavy_output_with_a_stuck_subscriber_loses_no_line_in_the_file(supervise) -> None:
    code = "import sys\nfor i in range(200000): sys.stdout.write(f'line {i}\\n')\n"
    h = supervise([spec("chatty", [sys.executable, "-c", code])], exit_with="chatty")
    stuck = h.sup.subscribe(max_pending=100)
    assert (await h.run_task).exit_code == 0
    log = (h.sup.run_dir / "logs" / "chatty.log").read_text().splitlines()
    assert len(log) == 200000 and log[-1] == "line 199999"
    assert h.sup.status()["chatty"].state == State.COMPLETED
    dropped = 0
    while stuck._queue or stuck._dropped:
        event = await stuck.__anext__()
        dropped += getattr(event, "dropped", 0)
    assert dropped > 0
    stuck.close()


async def test_a_silent_process_still_has_its_log_file(supervise) -> None:
    silent = spec("inference", [sys.executable, "-c", "import time; time.sleep(600)"])
    h = supervise([silent])
    await h.state("inference", State.RUNNING)
    log = h.sup.run_dir / "logs" / "inference.log"
    assert log.is_file() and log.read_bytes() == b""
    await h.sup.shutdown("test")
    assert log.is_file() and log.read_bytes() == b""
