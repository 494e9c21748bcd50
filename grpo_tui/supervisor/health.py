"""A process's health: the last result of each of its checks in this incarnation.

Its checks are its liveness and progress probes (``probes.py``) and its own word: a child
may report its health on the control socket (``{"type": "health", "ok": false, "reason":
"..."}``, docs/control-socket.md), e.g. a program whose work keeps failing while it runs.
Health is ``ok`` while the last result of every check passed, ``failing`` while one
failed (``failing`` says which and what it saw), None before any said anything. A report
changes no state: what a failing probe does (stop and restart) is the life's; a process
that says it fails is shown so, and goes on.
"""

from __future__ import annotations

SELF = "self"
"""The check a process reports on itself over the control socket."""


class Health:
    """The last result of each check of one incarnation (module docstring)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[bool, str]] = {}

    def clear(self) -> None:
        """A new incarnation, or one that no longer runs: nothing said yet."""
        self._last.clear()

    def record(self, check: str, ok: bool, message: str) -> bool:
        """The result of ``check``; whether it differs from its last one."""
        changed = self._last.get(check) != (ok, message)
        self._last[check] = (ok, message)
        return changed

    @property
    def value(self) -> str | None:
        """``ok``, ``failing``, or None while no check has said anything."""
        if not self._last:
            return None
        return "failing" if self.failing else "ok"

    @property
    def failing(self) -> dict[str, str]:
        """``check -> what it saw`` for each check whose last result failed."""
        return {check: message for check, (ok, message) in self._last.items() if not ok}
