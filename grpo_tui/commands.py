"""The command palette's provider: every dashboard action, per process where it applies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from grpo_tui.screens.host import DashboardHost
from grpo_tui.screens.mode_switch import MODE_SUMMARIES

PROCESS_OPERATIONS = ("restart", "stop", "start", "kill")


class ActionsProvider(Provider):
    """Commands built from the live process list, so new processes show up on their own."""

    def commands(self) -> Iterator[tuple[str, Callable[[], object], str]]:
        """(name, callback, help) of every command available now."""
        app = cast(DashboardHost, self.app)
        if not app.read_only:
            for name in app.state.processes:
                for operation in PROCESS_OPERATIONS:
                    yield (
                        f"{operation.capitalize()} {name}",
                        partial(app.action_process_action, operation, name),
                        f"{operation} the process {name!r}",
                    )
            yield (
                "Restart inference",
                app.action_restart_inference,
                "restart the inference server",
            )
            yield (
                "Edit hyperparameters",
                app.action_live_edit,
                "change lr, beta, clip, temperature ... from the next step",
            )
            yield (
                "Switch weight-sync mode",
                app.action_switch_training_mode,
                f"open the mode switch ({', '.join(MODE_SUMMARIES)})",
            )
        for name in app.state.logs:
            yield (f"Logs: {name}", partial(app.action_show_logs, name), f"show {name}'s output")
        yield ("Dashboard", app.action_show_dashboard, "back to the dashboard")
        yield ("Help: keys", app.action_help, "every key and its binding id")
        yield ("Quit", app.action_quit, "ordered shutdown of every process, then exit")

    async def discover(self) -> Hits:
        for name, callback, text in self.commands():
            yield DiscoveryHit(name, callback, help=text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, text in self.commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=text)
