"""Asking the supervisor to restart inference on new weights, then waiting for health.

The trainer never stops processes itself: it sends a ``restart`` request on the control
socket (docs/control-socket.md) and the supervisor restarts only its own child.
"""

from __future__ import annotations

import time
from typing import Any

from grpo_trainer.control import (
    SOCKET_ENV,
    ControlError,
    SupervisorLink,
    SupervisorShuttingDown,
)
from grpo_trainer.sync.client import InferenceClient, SyncError


class SupervisorStopping(SyncError):
    """The supervisor refused the restart because the run is shutting down.

    Not retried: the trainer treats it as a stop request (checkpoint, exit 0), since the
    supervisor is about to stop it anyway.
    """


def supervisor_missing(mode: str) -> str:
    """Why ``mode`` cannot sync without a supervisor, as one line for the user."""
    return (
        f"mode {mode} needs the grpo-tui supervisor: run it under grpo-tui or use "
        f"--sync-every 0 ({SOCKET_ENV} is not set)"
    )


def require_link(link: SupervisorLink | None, mode: str) -> SupervisorLink:
    """The supervisor link a restart mode needs; ``SyncError`` when none runs us."""
    if link is None:
        link = SupervisorLink.from_env()
    if link is None:
        raise SyncError(supervisor_missing(mode))
    return link


class InferenceRestarts:
    """What a strategy whose syncs restart inference holds: the supervisor link (required:
    ``SyncError`` without one) and how long a restart may take."""

    def __init__(
        self, mode: str, link: SupervisorLink | None = None, timeout: float = 600.0
    ) -> None:
        self.link = require_link(link, mode)
        self.timeout = timeout

    def restart(self, client: InferenceClient, args: dict[str, Any]) -> int | None:
        """``restart_inference`` with this strategy's link and timeout; the incarnation."""
        return restart_inference(self.link, client, args, timeout=self.timeout)


def restart_inference(
    link: SupervisorLink,
    client: InferenceClient,
    args: dict[str, Any],
    *,
    timeout: float,
    attempts: int = 3,
    backoff: float = 1.0,
) -> int | None:
    """Restart ``inference`` with ``args`` and wait until it is healthy; retry with backoff.
    Returns the incarnation the supervisor started (None: its reply names none).

    Raises ``SupervisorStopping`` at once when the supervisor is shutting down, else
    ``SyncError`` after ``attempts`` failures.
    """
    last = ""
    for attempt in range(attempts):
        if attempt:
            link.send_event("warning", f"inference restart failed ({last}); retrying")
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            reply = link.request("restart", process="inference", args=args, timeout=timeout)
            client.wait_healthy(timeout)
            incarnation = reply.get("incarnation")
            return incarnation if isinstance(incarnation, int) else None
        except SupervisorShuttingDown as error:
            raise SupervisorStopping(str(error)) from None
        except (ControlError, SyncError) as error:
            last = str(error)
    link.send_event("error", f"inference restart failed after {attempts} attempts: {last}")
    raise SyncError(f"inference restart with {args} failed: {last}")
