"""Console output that a closed stdout cannot break: the run goes on, silently.

A headless run's stdout is often a pipe: ``| head -3`` closes it after three lines, a ``tee``
killed by the same Ctrl-C closes it mid-shutdown, a terminal that went away turns every
write into ``EIO``. None of these is a reason to abort a training run or to skip its
ordered shutdown, its final checkpoint and the end of ``events.jsonl``. :class:`SafeStream`
wraps the stream: the first write that fails marks it closed, points its file descriptor
at ``/dev/null`` (so that nothing else writing there, Python's flush at exit included,
fails either) and tells ``on_close`` once; later writes are dropped.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TextIO

GONE = {errno.EPIPE, errno.EIO, errno.ENXIO, errno.EBADF}
"""Errors of a write to an output that is gone: a closed pipe, a hung-up terminal."""


class SafeStream:
    """A text stream for rich's ``Console(file=...)`` and JSON lines; see the module doc."""

    def __init__(self, stream: TextIO, on_close: Callable[[str], None] | None = None) -> None:
        self.stream = stream
        self.on_close = on_close
        self.closed_reason: str | None = None

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self.closed_reason is None and self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def write(self, text: str) -> int:
        if self.closed_reason is None:
            try:
                self.stream.write(text)
            except OSError as error:
                self._gone(error)
        return len(text)

    def flush(self) -> None:
        if self.closed_reason is None:
            try:
                self.stream.flush()
            except OSError as error:
                self._gone(error)

    def _gone(self, error: OSError) -> None:
        if error.errno not in GONE:
            raise error
        self.closed_reason = f"{error.strerror or error} (errno {error.errno})"
        try:  # what the buffer still holds would fail again at every flush
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass  # no descriptor to redirect (a StringIO in a test): dropping is enough
        if self.on_close is not None:
            self.on_close(self.closed_reason)
