"""Headless runs: the same supervisor as the dashboard, reported on a console or as JSON lines.

``grpo-tui run`` creates the run directory, writes the resolved profile into it, supervises
until the ``exit_with`` process ends (or SIGINT/SIGTERM asks for an ordered shutdown) and
prints a summary. The console shows state transitions, probe failures, restarts, control
requests, notices and a metrics line every few seconds; ``--json`` prints every event as
one JSON object per line on stdout instead (human messages then go to stderr).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import tomli_w
from rich.console import Console
from rich.markup import escape

from grpo_tui.notify import Notifier
from grpo_tui.output import SafeStream
from grpo_tui.plan.roles import Plan
from grpo_tui.run_summary import STATE_STYLES, RunSummary
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.bus import Subscription
from grpo_tui.supervisor.events import (
    Event,
    LogBatch,
    MetricsRecord,
    NeedLost,
    NeedRegained,
    Notice,
    ProbeResult,
    RequestReceived,
    Restarting,
    Stalled,
    State,
    StateChanged,
)
from grpo_tui.supervisor.health import SELF
from grpo_tui.supervisor.supervisor import Supervisor

ALLOCATION_FILE = "allocation.json"

METRICS_EVERY = 5.0
"""Seconds between metrics lines on the console."""


METRICS_SHOWN = (
    ("loss", "loss", "{:.4f}"),
    ("reward/mean", "reward", "{:.3f}"),
    ("mean_ratio", "mean_ratio", "{:.3f}"),
    ("clipped_fraction", "clipped", "{:.2f}"),
    ("off_policy_lag", "lag", "{:.0f}"),
    ("tokens_per_s", "tok/s", "{:.0f}"),
)


ENDED = (State.COMPLETED, State.STOPPED, State.FAILED)
"""States whose exit code is worth printing (later transitions repeat a stale one)."""

LEVEL_STYLES = {"info": "blue", "warning": "yellow", "error": "bold red"}

SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Each asks for an ordered shutdown; SIGHUP (the terminal went away) only where it is not
ignored already (``nohup``), and the run then ends with ``128 + signal`` (130, 143, 129)."""


def write_run_dir(plan: Plan) -> Path:
    """Create the run directory and write the resolved profile (``profile.toml``) into it.

    On a cluster also ``allocation.json``: the job, its nodes and the supervisor's host,
    which ``grpo-tui attach`` reads from a login node.
    """
    run_dir = plan.run_dir
    run_dir.mkdir(parents=True, exist_ok=False)
    if plan.roles.cluster.slurm:
        (run_dir / ALLOCATION_FILE).write_text(json.dumps(allocation_record(plan), indent=1))
    header = (
        f"# Resolved from {plan.profile.path} by `grpo-tui run` on "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} (mode {plan.roles.mode}).\n"
    )
    (run_dir / "profile.toml").write_text(header + tomli_w.dumps(plan.profile.resolved()))
    return run_dir


def allocation_record(plan: Plan) -> dict[str, Any]:
    """Where a cluster run lives: job id, node names and addresses, supervisor host."""
    allocation = plan.roles.allocation
    return {
        "job_id": allocation.job_id,
        "nodes": list(allocation.names),
        "addresses": list(allocation.addresses),
        "supervisor_host": socket.gethostname(),
        "supervisor_node": allocation.names[0],
    }


class ConsoleReport:
    """Renders events for a person: one line per thing worth seeing, metrics every few s."""

    def __init__(self, console: Console, *, echo_logs: bool) -> None:
        self.console = console
        self.echo_logs = echo_logs
        self.metrics: dict[str, float] = {}
        self.step: int | None = None
        self._printed_step: int | None = None
        self._probe_failing: dict[tuple[str, str], str] = {}

    def _line(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.console.print(f"[dim]{stamp}[/] {text}", soft_wrap=True, highlight=False)

    def handle(self, event: Event) -> None:
        """Print what a person needs to know about ``event``."""
        match event:
            case StateChanged():
                self._state(event)
            case ProbeResult():
                self._probe(event)
            case Restarting():
                self._line(
                    f"[magenta]{event.process}[/] restarting in {event.delay:.1f}s "
                    f"(attempt {event.attempt}): {escape(event.reason)}"
                )
            case RequestReceived():
                target = f" {event.target}" if event.target else ""
                self._line(
                    f"{event.process} asks: {event.action}{target} "
                    f"{escape(json.dumps(event.args, default=str))}"
                )
            case Notice(level="debug"):
                pass  # recorded in events.jsonl, not for the console
            case Notice():
                style = LEVEL_STYLES.get(event.level, "")
                self._line(f"[{style}]{event.level}[/] {escape(event.message)}")
            case NeedLost():
                self._need_lost(event)
            case NeedRegained():
                self._line(f"[green]{event.process}[/] has {escape(event.need)} again: going on")
            case Stalled():
                step = f", last step {event.step}" if event.step is not None else ""
                causes = "; ".join(event.causes)
                self._line(
                    f"[yellow]stalled[/] {event.process}: no progress for "
                    f"{event.seconds:.0f} s{step}: {escape(causes)}"
                )
            case MetricsRecord():
                self.metrics.update(event.data)
                shown = any(name in event.data for name, _, _ in METRICS_SHOWN)
                if event.step is not None and shown:
                    self.step = event.step
            case LogBatch():
                self._logs(event)

    def _state(self, event: StateChanged) -> None:
        if event.new == State.BACKOFF:
            return  # the Restarting event says it, with the attempt and the delay
        style = STATE_STYLES.get(event.new, "")
        details = []
        if event.pid is not None and event.new in (State.STARTING, State.RUNNING):
            details.append(f"pid {event.pid}")
        if event.exit_code is not None and event.new in ENDED:
            details.append(f"exit {event.exit_code}")
        if event.reason:
            details.append(event.reason)
        suffix = f" ({escape(', '.join(details))})" if details else ""
        self._line(f"[bold]{event.process}[/] {event.old} -> [{style}]{event.new}[/]{suffix}")
        if event.new in (State.READY, State.STARTING):
            self._probe_failing = {
                k: v for k, v in self._probe_failing.items() if k[0] != event.process
            }

    def _need_lost(self, event: NeedLost) -> None:
        what = "; ".join(f"{name} failed ({why})" for name, why in event.failed.items())
        then = (
            "stopping the run"
            if event.action == "stop"
            else f"waiting (on_needed_failure = wait): start {', '.join(event.failed)} again"
        )
        self._line(
            f"[bold red]{event.process} cannot go on[/] without {escape(event.need)}: "
            f"{escape(what)}; {then}"
        )
        for name, lines in event.last_lines.items():
            for line in lines:
                self.console.print(f"    [dim]{name} |[/] {escape(line)}", soft_wrap=True)

    def _probe(self, event: ProbeResult) -> None:
        key = (event.process, event.probe)
        if event.ok:
            if self._probe_failing.pop(key, None) is None or event.probe == "readiness":
                return
            if event.probe == SELF:
                self._line(f"{event.process} reports itself ok again: {escape(event.message)}")
            else:
                self._line(f"{event.process} {event.probe} probe ok again")
            return
        if self._probe_failing.get(key) == event.message:
            return
        self._probe_failing[key] = event.message
        if event.probe == "readiness":
            self._line(f"[dim]{event.process} not ready yet: {escape(event.message)}[/]")
        elif event.probe == SELF:
            self._line(
                f"{event.process} [bold red]reports itself failing[/]: {escape(event.message)}"
            )
        else:
            self._line(
                f"{event.process} [bold red]{event.probe} probe failing[/]: "
                f"{escape(event.message)}"
            )

    def _logs(self, event: LogBatch) -> None:
        if event.dropped:
            self._line(f"[yellow]{event.process}: {event.dropped} log lines not shown[/]")
        if self.echo_logs:
            for line in event.lines:
                self.console.print(
                    f"[dim]{event.process} |[/] {escape(line)}", soft_wrap=True, highlight=False
                )

    def metrics_line(self) -> None:
        """Print the latest training metrics if a new step arrived since the last line."""
        if self.step is None or self.step == self._printed_step:
            return
        self._printed_step = self.step
        total = self.metrics.get("training_steps")
        parts = [f"step {self.step}" + (f"/{total:.0f}" if total else "")]
        for name, label, fmt in METRICS_SHOWN:
            if name in self.metrics:
                parts.append(f"{label} {fmt.format(self.metrics[name])}")
        self._line("[bold blue]metrics[/] " + "  ".join(parts))


class JsonLines:
    """Every event as one JSON object per line, for machines (CI, jq, log shippers)."""

    def __init__(self, stream: SafeStream | TextIO) -> None:
        self.stream = stream

    def handle(self, event: Event) -> None:
        self.write(event.to_json())

    def write(self, record: dict[str, Any]) -> None:
        self.stream.write(json.dumps(record, default=str) + "\n")
        self.stream.flush()


class HeadlessRun:
    """One supervised run without a UI; ``run()`` returns the process exit status."""

    def __init__(
        self,
        plan: Plan,
        *,
        json_lines: bool = False,
        echo_logs: bool = False,
        until_stopped: bool = False,
        when_ready: tuple[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.until_stopped = until_stopped
        """A run meant to last until it is stopped (``grpo-tui serve``): a signal's ordered
        stop is its normal end, exit 0."""
        self.when_ready = when_ready
        """``(process, line)``: the line said each time that process becomes ready."""
        self.supervisor: Supervisor | None = None
        stdout = SafeStream(sys.stdout, on_close=lambda why: self._output_closed("stdout", why))
        self.json = JsonLines(stdout) if json_lines else None
        human = SafeStream(sys.stderr, lambda why: self._output_closed("stderr", why))
        self.console = Console(
            file=human if json_lines else stdout, highlight=False, soft_wrap=True
        )
        self.report = ConsoleReport(self.console, echo_logs=echo_logs)
        self.signalled: signal.Signals | None = None
        self.notifier: Notifier | None = None
        self._shutdown: asyncio.Task[None] | None = None

    async def run(self) -> int:
        run_dir = self.plan.run_dir
        stack = GrpoStack.from_plan(self.plan)  # answers the GRPO requests of the socket
        supervisor = stack.supervisor
        self.console.print(
            f"[bold]grpo-tui {'serve' if self.until_stopped else 'run'}[/] "
            f"{escape(str(self.plan.profile.path))} -> "
            f"{escape(str(run_dir))} (mode {self.plan.roles.mode}, "
            f"exit_with {self.plan.exit_with or '-'})",
            highlight=False,
        )
        self.supervisor = supervisor
        subscription = supervisor.subscribe()
        consumer = asyncio.create_task(self._consume(subscription))
        ticker = asyncio.create_task(self._metrics_ticker())
        loop = asyncio.get_running_loop()
        handled = [
            sig
            for sig in SHUTDOWN_SIGNALS
            if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN
        ]
        for sig in handled:
            loop.add_signal_handler(sig, self._on_signal, supervisor, sig)
        try:
            notify = self.plan.profile.run.notify
            if notify:
                self.notifier = Notifier(notify, supervisor, run_dir.name)
                outcome = await self.notifier.run(stack.run())
            else:
                outcome = await stack.run()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
            ticker.cancel()
            subscription.close()
            await consumer
        self.report.metrics_line()
        code = outcome.exit_code
        if self.signalled is not None:
            code = 0 if self.until_stopped else 128 + self.signalled
        self._summary(supervisor, code, outcome.reason)
        return code

    def _output_closed(self, stream: str, why: str) -> None:
        """Say in ``events.jsonl`` why the console went quiet; the run itself goes on."""
        if self.supervisor is not None:
            self.supervisor.notice(
                f"{stream} closed ({why}): the run goes on without console output; "
                f"its events are in {self.plan.run_dir / 'events.jsonl'}",
                level="warning",
            )

    def _on_signal(self, supervisor: Supervisor, sig: signal.Signals) -> None:
        if self.signalled is not None:
            self.console.print(f"{sig.name} again: already shutting down (timeouts apply)")
            return
        self.signalled = sig
        self.console.print(f"[yellow]{sig.name}[/]: ordered shutdown (reverse dependency order)")
        self._shutdown = asyncio.create_task(supervisor.shutdown(f"received {sig.name}"))

    async def _consume(self, subscription: Subscription) -> None:
        sink: JsonLines | ConsoleReport = self.json or self.report
        async for event in subscription:
            sink.handle(event)
            if self._became_ready(event) and self.when_ready is not None:
                self.console.print(f"[bold green]{escape(self.when_ready[1])}[/]", soft_wrap=True)

    def _became_ready(self, event: Event) -> bool:
        """``event`` makes the ``when_ready`` process ready."""
        if self.when_ready is None or not isinstance(event, StateChanged):
            return False
        return event.process == self.when_ready[0] and event.new is State.READY

    async def _metrics_ticker(self) -> None:
        while True:
            await asyncio.sleep(METRICS_EVERY)
            if self.json is None:
                self.report.metrics_line()

    def _summary(self, supervisor: Supervisor, exit_code: int, reason: str) -> None:
        run_dir = self.plan.run_dir
        if self.json is not None:
            self.json.write(
                {
                    "type": "RunFinished",
                    "t": time.time(),
                    "exit_code": exit_code,
                    "reason": reason,
                    "run_dir": str(run_dir),
                }
            )
        metrics = self.report.metrics
        total = metrics.get("training_steps")
        RunSummary(
            run_dir,
            exit_code,
            reason,
            supervisor.status(),
            step=self.report.step,
            total_steps=int(total) if total else None,
            reward=metrics.get("reward/mean"),
            notify_problems=self.notifier.problems if self.notifier is not None else (),
        ).print(self.console)


def run_headless(
    plan: Plan,
    *,
    json_lines: bool = False,
    echo_logs: bool = False,
    until_stopped: bool = False,
    when_ready: tuple[str, str] | None = None,
) -> int:
    """Create the run directory and supervise the plan to the end; returns the exit status
    (see :class:`HeadlessRun` for ``until_stopped`` and ``when_ready``)."""
    write_run_dir(plan)
    run = HeadlessRun(
        plan,
        json_lines=json_lines,
        echo_logs=echo_logs,
        until_stopped=until_stopped,
        when_ready=when_ready,
    )
    return asyncio.run(run.run())
