"""The Textual app: wires one GRPO stack's supervisor (or a run's files) to the screens.

One worker runs ``GrpoStack.run()`` (through ``[run] notify``'s :class:`Notifier` when the
profile has one), one pumps its events into a plain :class:`RunState`, and a 2 Hz timer
copies ``Supervisor.status()`` into it; screens draw that state on their own timers. Every
binding has an id (remap in ``~/.config/grpo-tui/keymap.toml``: :mod:`grpo_tui.keymap`)
and every action is in the command palette (:mod:`grpo_tui.commands`). Quitting runs the
supervisor's ordered shutdown; while a trainer is running it asks first. The entry points
that build and run the app, and print the run's summary after it, are in
:mod:`grpo_tui.launch`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver
from textual.worker import Worker

from grpo_tui.alerts import Alert, evaluate
from grpo_tui.commands import ActionsProvider
from grpo_tui.driver import QuickEscapeDriver
from grpo_tui.keymap import default_keymap_path, read_keymap
from grpo_tui.run_state import RunState
from grpo_tui.screens.dashboard import DashboardScreen
from grpo_tui.screens.help import HelpScreen
from grpo_tui.screens.host import RunControl
from grpo_tui.screens.inspector import InspectorScreen
from grpo_tui.screens.live_edit import LiveEditScreen
from grpo_tui.screens.logs import LogsScreen
from grpo_tui.screens.mode_switch import ModeSwitchScreen
from grpo_tui.screens.quit_confirm import QuitConfirmScreen
from grpo_tui.screens.run_viewer import RunViewerScreen
from grpo_tui.screens.timeline import TimelineScreen
from grpo_tui.stack.modes import RESTART_ALL

if TYPE_CHECKING:
    from grpo_tui.notify import Notifier
    from grpo_tui.stack.stack import GrpoStack
    from grpo_tui.supervisor.bus import Subscription
    from grpo_tui.supervisor.supervisor import RunOutcome

STATUS_PERIOD = 0.5
FOLLOW_PERIOD = 1.0
"""Seconds between reads of a followed run's files (``grpo-tui attach``)."""
MUTATING_ACTIONS = frozenset(
    {
        "restart_process",
        "stop_process",
        "start_process",
        "kill_process",
        "restart_inference",
        "switch_training_mode",
        "live_edit",
        "process_action",
    }
)


def binding_ids() -> set[str]:
    """Every binding id a keymap may name: the app's and each screen's."""
    owners = (
        GrpoTuiApp,
        DashboardScreen,
        InspectorScreen,
        TimelineScreen,
        LogsScreen,
        HelpScreen,
        ModeSwitchScreen,
        LiveEditScreen,
        QuitConfirmScreen,
    )
    return {
        binding.id
        for owner in owners
        for binding in owner.BINDINGS
        if isinstance(binding, Binding) and binding.id
    }


class GrpoTuiApp(App[int]):
    """The dashboard over a live :class:`GrpoStack` (its supervisor runs in the app), over a
    followed run with ``control`` (``grpo-tui attach``), or read-only over a
    :class:`RunState`."""

    CSS_PATH = "app.tcss"
    TITLE = "grpo-tui"
    COMMANDS = App.COMMANDS | {ActionsProvider}
    ENABLE_COMMAND_PALETTE = True
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-short"), (40, "-tall")]
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [
        (0, "-narrow"),
        (120, "-medium"),
        (160, "-wide"),
    ]

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "restart_process", "Restart", id="restart-process"),
        Binding("x", "stop_process", "Stop", id="stop-process"),
        Binding("s", "start_process", "Start", id="start-process"),
        Binding("K", "kill_process", "Kill", id="kill-process"),
        Binding("i", "restart_inference", "Restart inference", id="restart-inference"),
        Binding("m", "switch_training_mode", "Mode", id="switch-mode"),
        Binding("e", "live_edit", "Edit", id="live-edit"),
        Binding("d", "show_dashboard", "Dashboard", id="show-dashboard"),
        Binding("l", "show_logs", "Logs", id="show-logs"),
        Binding("g", "show_rollouts", "Rollouts", id="show-rollouts"),
        Binding("t", "show_timeline", "Timeline", id="show-timeline"),
        Binding("question_mark,f1", "help", "Help", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
    ]

    def __init__(
        self,
        state: RunState,
        *,
        stack: GrpoStack | None = None,
        control: RunControl | None = None,
        clock: Callable[[], float] = time.time,
        keymap_path: Path | None = None,
        follow: Callable[[], object] | None = None,
        notice: str = "",
        notifier: Notifier | None = None,
    ) -> None:
        super().__init__()
        self.notifier = notifier
        """Runs ``[run] notify`` on the run's end, failures, stalls, alerts."""
        self.state = state
        self.follow = follow
        self.stack = stack
        self.supervisor = stack.supervisor if stack is not None else None
        self.control: RunControl | None = stack if stack is not None else control
        self.notice = notice
        self.clock = clock
        self.keymap_path = keymap_path or default_keymap_path()
        self.keymap = read_keymap(self.keymap_path, binding_ids())
        self.outcome: RunOutcome | None = None
        self.alerts: dict[str, Alert] = {}
        self._run_worker: Worker[None] | None = None
        self._quitting = False
        self.logs_screen = LogsScreen()
        self.help_screen = HelpScreen()

    @property
    def read_only(self) -> bool:
        return self.control is None

    def get_driver_class(self) -> type[Driver]:
        """Textual's driver for this terminal; on Linux / macOS, the one with a quick Esc."""
        driver = super().get_driver_class()
        return QuickEscapeDriver if driver is LinuxDriver else driver

    # -- life cycle -------------------------------------------------------------------

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        self.install_screen(self.logs_screen, "logs")
        self.install_screen(InspectorScreen(), "rollouts")
        self.install_screen(TimelineScreen(), "timeline")
        self.install_screen(self.help_screen, "help")
        if not self.is_headless:
            self.call_after_refresh(self._freeze_startup_objects)
        if self.supervisor is None:
            self.push_screen(RunViewerScreen() if self.read_only else DashboardScreen())
            if self.follow is not None:
                self.set_interval(FOLLOW_PERIOD, self.follow)
            if self.notice:
                severity = "warning" if self.read_only else "information"
                self.notify(self.notice, title="attached", severity=severity, timeout=10)
            return
        if self.state.started_at is None:
            self.state.started_at = self.clock()
        self.push_screen(DashboardScreen())
        if self.notice:  # what the run is for (grpo-tui serve: the URL to attach to)
            self.notify(self.notice, title="grpo-tui", timeout=30)
        self._pump_events(self.supervisor.subscribe())
        self._run_worker = self._run_supervisor()
        self._copy_status()
        self.set_interval(STATUS_PERIOD, self._copy_status)

    def _freeze_startup_objects(self) -> None:
        """Keep what start-up built (modules, stylesheet, the dashboard) out of every GC pass.

        Python's full collections walk every tracked object: ~150k here, ~100 ms each, and
        the allocation churn of a run under load triggered one every second or so, landing
        on key presses (the slowest 10 % of them, traced). Frozen, a pass walks the ~50k
        objects made since: ~20 ms. Not in headless runs (tests), where frozen apps would
        pile up in one process.
        """
        gc.collect()
        gc.freeze()

    @work(group="pump")
    async def _pump_events(self, subscription: Subscription) -> None:
        """The one subscriber: folds every supervisor event into the plain state."""
        try:
            async for event in subscription:
                self.state.apply(event)
        finally:
            subscription.close()

    @work(group="supervisor", exit_on_error=False)
    async def _run_supervisor(self) -> None:
        assert self.stack is not None
        run = self.stack.run()
        outcome = await (self.notifier.run(run) if self.notifier is not None else run)
        self.outcome = outcome
        self.state.outcome = f"exit {outcome.exit_code}: {outcome.reason}"
        self.state.finished_at = self.clock()
        self._copy_status()
        if not self._quitting:
            severity = "information" if outcome.exit_code == 0 else "error"
            self.notify(self.state.outcome, title="run finished", severity=severity, timeout=30)

    async def on_unmount(self) -> None:
        """However the app ends, the supervised processes end with it (ordered shutdown)."""
        if self.supervisor is not None and self.outcome is None:
            await self.supervisor.shutdown("dashboard closed")

    def _copy_status(self) -> None:
        if self.supervisor is not None:
            self.state.sync_status(self.supervisor.status())

    def check_alerts(self) -> list[Alert]:
        """Evaluate the alerts; announce each new one once (a toast), return all active."""
        active = {alert.key: alert for alert in evaluate(self.state, self.clock())}
        for key, alert in active.items():
            if key not in self.alerts:
                self.notify(alert.message, title="alert", severity="warning", timeout=8)
        self.alerts = active
        return list(active.values())

    # -- actions ----------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (self.read_only and action in MUTATING_ACTIONS)

    def key_bindings(self) -> list[Binding]:
        """The app-wide bindings, for the help screen."""
        return [b for b in self.BINDINGS if isinstance(b, Binding)]

    @property
    def selected_process(self) -> str | None:
        screen = self.screen
        if isinstance(screen, DashboardScreen | LogsScreen):
            return screen.selected_process
        return None

    def _act(self, label: str, call: Callable[[], Awaitable[Any]]) -> None:
        async def act() -> None:
            try:
                await call()
            except Exception as error:
                self.notify(f"{label} failed: {error}", severity="error", timeout=10)
            else:
                self.notify(f"{label}: done", timeout=4)

        self.notify(f"{label} ...", timeout=3)
        self.run_worker(act(), group="actions", exit_on_error=False)

    def action_process_action(self, operation: str, name: str | None = None) -> None:
        """``restart`` / ``stop`` / ``start`` / ``kill`` a process (the selected one by default)."""
        target = name or self.selected_process
        if self.control is None:
            return
        if target is None:
            self.notify("select a process first", severity="warning")
            return
        control = self.control
        calls: dict[str, Callable[[], Awaitable[None]]] = {
            "restart": lambda: control.restart(target),
            "stop": lambda: control.stop(target),
            "start": lambda: control.start(target),
            "kill": lambda: control.kill(target),
        }
        self._act(f"{operation} {target}", calls[operation])

    def action_restart_process(self) -> None:
        self.action_process_action("restart")

    def action_stop_process(self) -> None:
        self.action_process_action("stop")

    def action_start_process(self) -> None:
        self.action_process_action("start")

    def action_kill_process(self) -> None:
        self.action_process_action("kill")

    def action_restart_inference(self) -> None:
        name = next(
            (row.name for row in self.state.processes.values() if row.role == "inference"),
            None,
        )
        if name is None:
            self.notify("no inference process in this run", severity="warning")
            return
        self.action_process_action("restart", name)

    def action_switch_training_mode(self) -> None:
        """The mode dialog, saying what a switch does from the plan the switch asks
        (``GrpoStack.switch_mode``: a stack without a plan restarts both; an attached run's
        own supervisor plans it)."""
        planner = None
        if self.stack is not None:
            planner = self.stack.planner or (lambda _: RESTART_ALL)
        self.push_screen(ModeSwitchScreen(self.state.mode, planner))

    def action_live_edit(self) -> None:
        def applied(result: dict[str, Any] | None) -> None:
            if result:
                values = ", ".join(f"{k}={v}" for k, v in result["values"].items())
                self.notify(f"edited {values}: from the next step", timeout=6)

        self.push_screen(LiveEditScreen(), applied)

    async def switch_training_mode(self, mode: str) -> None:
        """Run the stack's mode switch (``GrpoStack.switch_mode``); the modal shows it."""
        assert self.control is not None
        await self.control.switch_mode(mode)
        self.state.mode = mode

    def action_show_dashboard(self) -> None:
        """Back to the dashboard from a screen it opened (logs, rollouts, timeline)."""
        if self.screen in (self.logs_screen, *self._views()):
            self.pop_screen()

    def _views(self) -> list[object]:
        return [self.get_screen(name) for name in ("rollouts", "timeline")]

    def action_show_rollouts(self) -> None:
        self._show_view("rollouts")

    def action_show_timeline(self) -> None:
        self._show_view("timeline")

    def _show_view(self, name: str) -> None:
        """Bring an installed view to the top (from the dashboard or another view)."""
        screen = self.get_screen(name)
        if self.screen is screen:
            return
        if self.screen in (self.logs_screen, *self._views()):
            self.pop_screen()
        self.push_screen(name)

    def action_show_logs(self, name: str | None = None) -> None:
        """Open the logs screen on ``name`` (default: the selected process)."""
        target = name or self.selected_process
        if self.screen is not self.logs_screen:
            self.push_screen("logs")
        if target is not None:
            self.logs_screen.show_stream(target)

    def action_help(self) -> None:
        """Show the keys; the screen is built once and kept (the keymap is fixed at start)."""
        if self.help_screen not in self.screen_stack:
            self.push_screen("help")

    async def action_quit(self) -> None:
        """Ordered shutdown, asking first while a trainer is running (attached: leave it)."""
        if self.supervisor is None or self.outcome is not None:
            self.exit(self.outcome.exit_code if self.outcome else 0)
            return
        if self._quitting:
            return
        if self.state.training():
            step, total = self.state.step(), self.state.total_steps()
            progress = f"step {step if step is not None else '-'} / {total or '?'}"
            self.push_screen(QuitConfirmScreen(progress), self._quit_confirmed)
        else:
            self._shutdown_and_exit()

    def _quit_confirmed(self, confirmed: bool | None) -> None:
        if confirmed:
            self._shutdown_and_exit()

    @work(group="quit", exclusive=True)
    async def _shutdown_and_exit(self) -> None:
        assert self.supervisor is not None
        self._quitting = True
        # an action still waiting (e.g. a restart waiting for readiness) must not start a
        # process again behind the shutdown
        self.workers.cancel_group(self, "actions")
        self.notify("stopping every process in order ...", timeout=30)
        await self.supervisor.shutdown("quit from the dashboard")
        if self._run_worker is not None:
            await self._run_worker.wait()
        self.exit(self.outcome.exit_code if self.outcome else 0)
