"""Child output: raw bytes to a rotated log file, decoded lines to a ring buffer and batches.

Output is read in chunks, never with ``readline``: a line of megabytes, a final line with no
newline and bytes that are not UTF-8 all reach the log file exactly as the child wrote them.
Decoding (``errors="replace"``) happens only for the in-memory views (ring buffer, events),
where one very long line is cut to ``max_line_chars`` so that a UI never chokes on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

ROTATE_BYTES = 50 * 1024 * 1024
ROTATE_KEEP = 3
RING_LINES = 5_000
MAX_LINE_CHARS = 16_384


class RotatingLog:
    """Append-only byte log that rotates at a line boundary once it passes ``max_bytes``.

    ``name.log`` is the newest file, ``name.log.1`` .. ``name.log.<keep>`` the older ones.
    """

    def __init__(self, path: Path, *, max_bytes: int = ROTATE_BYTES, keep: int = ROTATE_KEEP):
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._file: BinaryIO | None = None
        self._size = 0

    def open(self) -> None:
        """Create (or reopen) the file now, so a process that never prints still has one."""
        if self._file is None:
            self._open()

    def write(self, data: bytes) -> None:
        self.open()
        if self._size + len(data) > self.max_bytes:
            cut = data.rfind(b"\n") + 1
            if cut:
                self._write(data[:cut])
                self._rotate()
                data = data[cut:]
        self._write(data)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self._size = self._file.tell()

    def _write(self, data: bytes) -> None:
        assert self._file is not None
        self._file.write(data)
        self._size += len(data)

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        for index in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self.path.open("ab")
        self._size = 0

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class LineSplitter:
    """Turns chunks of bytes into decoded lines, keeping a partial line across chunks.

    Only the first ``max_line_chars`` bytes of a line are kept in memory: the rest is counted
    and noted at the end of the decoded line (the log file has it all).
    """

    def __init__(self, max_line_chars: int = MAX_LINE_CHARS) -> None:
        self.max_line_chars = max_line_chars
        self._partial = bytearray()
        self._partial_len = 0

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._take(chunk[start:end])
            lines.append(self._finish())
            start = end + 1
        self._take(chunk[start:])
        return lines

    def close(self) -> list[str]:
        """The final line if the child ended without a newline."""
        return [self._finish()] if self._partial_len else []

    def _take(self, piece: bytes) -> None:
        room = self.max_line_chars - len(self._partial)
        if room > 0:
            self._partial += piece[:room]
        self._partial_len += len(piece)

    def _finish(self) -> str:
        text = self._partial.decode("utf-8", errors="replace")
        if self._partial_len > len(self._partial):
            text += f" … [{self._partial_len - len(self._partial)} more bytes in the log file]"
        self._partial.clear()
        self._partial_len = 0
        return text


class OutputSink:
    """Everything one process prints: log file, ring buffer, lines waiting for the next batch.

    ``on_line`` (if set) sees every decoded line; the log-line readiness probe uses it.
    ``on_lines`` (if set) is told that new lines wait in ``pending`` (the batcher wakes up).
    """

    def __init__(self, path: Path, *, ring_lines: int = RING_LINES) -> None:
        self.file = RotatingLog(path)
        self.ring: deque[str] = deque(maxlen=ring_lines)
        self.pending: list[str] = []
        self.on_line: Callable[[str], None] | None = None
        self.on_lines: Callable[[], None] | None = None
        self._splitter = LineSplitter()

    def feed(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self._accept(self._splitter.feed(chunk))

    def end_of_stream(self) -> None:
        """The child closed its output: keep a trailing partial line, start the next fresh."""
        self._accept(self._splitter.close())
        self._splitter = LineSplitter()
        self.file.flush()

    def _accept(self, lines: list[str]) -> None:
        if not lines:
            return
        self.ring.extend(lines)
        self.pending.extend(lines)
        if self.on_line is not None:
            for line in lines:
                self.on_line(line)
        if self.on_lines is not None:
            self.on_lines()

    def take_pending(self) -> list[str]:
        lines, self.pending = self.pending, []
        return lines

    def close(self) -> None:
        self.file.close()
