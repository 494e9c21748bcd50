"""What the screens and the command palette ask of the app they run in.

``grpo_tui.app.GrpoTuiApp`` is that app; the screens type against these protocols instead,
so that they import nothing of the app that imports them (``tests/tui/test_tui_host.py``
checks that the app has every member named here).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from textual.binding import Binding

from grpo_tui.alerts import Alert
from grpo_tui.run_state import RunState


class RunControl(Protocol):
    """What the dashboard's actions call: the :class:`GrpoStack` it runs, or an attached
    run's control socket (:class:`grpo_tui.attach.AttachedControl`)."""

    run_dir: Path

    async def restart(self, name: str) -> None: ...

    async def stop(self, name: str) -> None: ...

    async def start(self, name: str) -> None: ...

    async def kill(self, name: str) -> None: ...

    async def switch_mode(self, mode: str) -> None: ...

    def edit(self, values: dict[str, Any]) -> dict[str, Any]: ...


class DashboardHost(Protocol):
    """The dashboard app as its screens see it: the run's state, its control (None: read
    only), the keymap, and the actions a screen or a palette command leads to."""

    state: RunState
    control: RunControl | None
    notice: str
    clock: Callable[[], float]
    keymap: dict[str, str]
    keymap_path: Path

    @property
    def read_only(self) -> bool: ...

    def check_alerts(self) -> list[Alert]: ...

    def key_bindings(self) -> list[Binding]: ...

    def call_after_refresh(
        self, callback: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> bool: ...

    async def switch_training_mode(self, mode: str) -> None: ...

    def action_process_action(self, operation: str, name: str | None = None) -> None: ...

    def action_restart_inference(self) -> None: ...

    def action_live_edit(self) -> None: ...

    def action_switch_training_mode(self) -> None: ...

    def action_show_dashboard(self) -> None: ...

    def action_show_logs(self, name: str | None = None) -> None: ...

    def action_help(self) -> None: ...

    async def action_quit(self) -> None: ...
