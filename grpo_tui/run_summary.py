"""What the terminal shows once a run is over, after ``grpo-tui run`` and after the
dashboard alike: how it ended, each process's last state (a failed one's last log lines),
the steps done and the last reward, the run directory and the commands to view and report
it, and what went wrong with the ``[run] notify`` command. No textual here.
"""

from __future__ import annotations

import shlex
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_tui.supervisor.events import State
from grpo_tui.supervisor.record import ProcessStatus

LOG_TAIL_LINES = 15
"""Lines of a failed process's log shown in the summary."""

STATE_STYLES = {
    State.READY: "green",
    State.RUNNING: "green",
    State.COMPLETED: "bold green",
    State.STARTING: "cyan",
    State.PENDING: "dim",
    State.STOPPING: "yellow",
    State.KILLING: "red",
    State.STOPPED: "yellow",
    State.BACKOFF: "magenta",
    State.UNHEALTHY: "bold red",
    State.FAILED: "bold red",
}


@dataclass(frozen=True)
class RunSummary:
    """The facts of a run that is over."""

    run_dir: Path
    exit_code: int
    reason: str
    processes: Mapping[str, ProcessStatus]
    step: int | None = None
    total_steps: int | None = None
    reward: float | None = None
    notify_problems: Sequence[str] = ()

    def print(self, console: Console) -> None:
        ok = self.exit_code == 0
        style = "bold green" if ok else "bold red"
        console.print(
            f"[{style}]run {'finished' if ok else 'failed'}[/]: {escape(self.reason)} "
            f"(exit {self.exit_code})"
        )
        for name, status in self.processes.items():
            extra = f", exit {status.exit_code}" if status.exit_code is not None else ""
            extra += f", external at {status.external}" if status.external else ""
            restarts = f", {status.restarts} restarts" if status.restarts else ""
            why = f" - {escape(status.last_reason)}" if status.last_reason else ""
            state = STATE_STYLES.get(status.state, "")
            console.print(f"  {name:<12} [{state}]{status.state}[/]{extra}{restarts}{why}")
            if status.state == State.FAILED:
                for line in log_tail(self.run_dir, name):
                    console.print(f"    [dim]|[/] {escape(line)}", soft_wrap=True)
        steps = f"{self.step if self.step is not None else '-'} / {self.total_steps or '?'}"
        reward = f"{self.reward:.3f}" if self.reward is not None else "-"
        console.print(f"steps:   {steps}, last reward {reward}")
        where = shlex.quote(str(self.run_dir))
        console.print(f"run dir: {escape(str(self.run_dir))}", soft_wrap=True)
        console.print(f"view:    grpo-tui view {escape(where)}", soft_wrap=True)
        console.print(f"report:  grpo-tui report {escape(where)}", soft_wrap=True)
        for problem in self.notify_problems:
            console.print(f"[yellow]notify:[/]  {escape(problem)}", soft_wrap=True)


def log_tail(run_dir: Path, process: str, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of ``logs/<process>.log`` (its last 64 KiB)."""
    path = run_dir / "logs" / f"{process}.log"
    if not path.is_file():
        return []
    with path.open("rb") as handle:
        handle.seek(0, 2)
        handle.seek(max(0, handle.tell() - 64 * 1024))
        tail = deque(handle.read().decode("utf-8", "replace").splitlines(), maxlen=lines)
    return list(tail)
