"""Files that grow in segments and keep only the newest ones: a bounded append-only log.

A log named ``stem`` in ``directory`` is a series of segments ``<stem>.<NNNNNN>.<ext>``
(one file per extension, e.g. ``data`` and ``index``). Appends go to the newest segment;
once its first extension's file passes ``segment_bytes`` the next append starts a new
segment, and segments beyond ``keep`` are deleted, oldest first. So a log never holds more
than ``keep * (segment_bytes + one append)`` bytes, and a reader that lists the directory sees whole
segments appear and old ones vanish (never a file truncated under it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO

KEEP_SEGMENTS = 4
NAME = re.compile(r"^(?P<stem>.+)\.(?P<segment>\d{6})\.(?P<ext>[a-z]+)$")


def read_after(path: Path, offset: int) -> bytes | None:
    """What ``path`` holds past ``offset`` (None: the file is gone)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()
    except FileNotFoundError:
        return None


def segment_path(directory: Path, stem: str, segment: int, ext: str) -> Path:
    return directory / f"{stem}.{segment:06d}.{ext}"


def list_segments(directory: Path, ext: str) -> dict[str, list[int]]:
    """Every log's segment numbers (ascending) that have a file with ``ext``, by stem."""
    found: dict[str, list[int]] = {}
    if not directory.is_dir():
        return found
    for path in directory.iterdir():
        match = NAME.match(path.name)
        if match and match["ext"] == ext:
            found.setdefault(match["stem"], []).append(int(match["segment"]))
    return {stem: sorted(segments) for stem, segments in found.items()}


class SegmentedLog:
    """Append-only, size-capped files of one writer (not thread-safe: one thread owns it)."""

    def __init__(
        self,
        directory: Path,
        stem: str,
        exts: tuple[str, ...],
        *,
        max_bytes: int,
        keep: int = KEEP_SEGMENTS,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.directory = directory
        self.stem = stem
        self.exts = exts
        self.keep = keep
        self.segment_bytes = max(1, max_bytes // keep)
        self.segment = -1
        self._files: dict[str, BinaryIO] = {}
        directory.mkdir(parents=True, exist_ok=True)
        self._start(self._next_segment())

    def _next_segment(self) -> int:
        """One past the newest segment on disk: a restarted writer, or a second process of
        the same name (a trainer resumed while the old one still exits), never appends to
        a file another writer had."""
        existing = list_segments(self.directory, self.exts[0]).get(self.stem, [])
        return max([*existing, self.segment]) + 1

    def _start(self, segment: int) -> None:
        self.close()
        self.segment = segment
        self._files = {
            ext: segment_path(self.directory, self.stem, segment, ext).open("ab")
            for ext in self.exts
        }
        for old in list_segments(self.directory, self.exts[0]).get(self.stem, [])[: -self.keep]:
            for ext in self.exts:
                segment_path(self.directory, self.stem, old, ext).unlink(missing_ok=True)

    def offsets(self) -> dict[str, int]:
        """Where the next :meth:`write` lands in each file (starting a new segment first when
        the current one is full)."""
        if self._files[self.exts[0]].tell() >= self.segment_bytes:
            self._start(self._next_segment())
        return {ext: handle.tell() for ext, handle in self._files.items()}

    def write(self, parts: dict[str, bytes]) -> None:
        """Append ``parts`` (bytes per extension) in ``exts`` order, each flushed before the
        next, so a reader never sees a later file point past an earlier one."""
        for ext in self.exts:
            if ext in parts:
                handle = self._files[ext]
                handle.write(parts[ext])
                handle.flush()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files = {}
