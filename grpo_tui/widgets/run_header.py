"""The run header, two lines that fit 100 columns.

Line 1: run name, mode, elapsed time, and where the run is: the trainer device's phase now
(once the trainer reports it), or ``finished`` with the outcome once the run has ended.
Line 2: step / total with a progress bar and the ETA, then the last step's seconds in each
phase (and, wide, each GPU's). Whatever does not fit is cut at the end of a line, so the
order is what matters most first.
"""

from __future__ import annotations

import time

from rich.console import RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from grpo_trainer.train.phases import CURRENT, PHASES, rank_times
from grpo_tui.run_state import RunState
from grpo_tui.widgets.process_table import format_duration

PER_GPU_WIDTH = 160
"""Columns from which the header adds each GPU's seconds per phase."""


class RunHeader(Widget):
    """Two lines drawn from a :class:`RunState` snapshot; :meth:`show` sets what to draw."""

    DEFAULT_CSS = "RunHeader { height: 2; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._renderable: RenderableType = Text("")

    def show(self, state: RunState, now: float, *, read_only: bool = False) -> None:
        step, total, eta = state.step(), state.total_steps(), state.eta_seconds()
        end = state.finished_at or now
        elapsed = format_duration(end - state.started_at) if state.started_at else "-"
        title = Text.assemble(
            ("grpo-tui ", "bold"),
            (state.run_name, "bold cyan"),
            ("  mode ", "dim"),
            (state.mode or "-", "bold yellow"),
            ("  elapsed ", "dim"),
            (elapsed, "bold"),
        )
        title.append_text(status_text(state))
        if read_only:
            title.append("  (read-only)", style="italic dim")
        title.no_wrap, title.overflow = True, "ellipsis"
        bar = Table.grid(padding=(0, 1), expand=True)
        bar.add_column(no_wrap=True)
        bar.add_column(ratio=1, min_width=10)
        bar.add_column(no_wrap=True)
        bar.add_column(no_wrap=True, max_width=max(0, self.size.width - 40) or None)
        done = step or 0
        times = step_times_text(state, per_gpu=self.size.width >= PER_GPU_WIDTH)
        times.no_wrap, times.overflow = True, "ellipsis"
        bar.add_row(
            Text(f"step {step if step is not None else '-'} / {total or '?'}", style="bold"),
            ProgressBar(total=float(total or 1), completed=float(done if total else 0)),
            Text(f"ETA {format_duration(eta)}" if eta is not None else "ETA -", style="dim"),
            times,
        )
        table = Table.grid(expand=True)
        table.add_row(title)
        table.add_row(bar)
        self._renderable = table
        self.refresh()

    def render(self) -> RenderableType:
        return self._renderable


def status_text(state: RunState) -> Text:
    """``  finished: exit 0: ...`` once the run ended, ``  not running`` for a record that
    stops without an end (a killed supervisor), else ``  phase training`` once the trainer
    reports its phase (empty before)."""
    if state.outcome:
        return Text.assemble(("  finished: ", "bold blue"), (state.outcome, "blue"))
    if state.finished_at is not None:
        at = time.strftime("%H:%M:%S", time.localtime(state.finished_at))
        return Text(f"  not running (its record ends at {at})", style="bold yellow")
    index = state.metrics.latest.get(CURRENT)
    if index is None or not 0 <= int(index) < len(PHASES):
        return Text("")
    return Text.assemble(("  phase ", "dim"), (PHASES[int(index)], "bold magenta"))


def step_times_text(state: RunState, *, per_gpu: bool = True) -> Text:
    """``last step: generating 0.41s training 0.08s ...`` and, ``per_gpu``, ``per GPU
    (ranks 0-1): training 0.50/0.47s ...`` (empty before the trainer reports a step)."""
    latest = state.metrics.latest
    spent = [(name, latest.get(f"phase/{name}_s")) for name in PHASES]
    shown = [f"{name} {seconds:.2f}s" for name, seconds in spent if seconds is not None]
    text = Text(f"last step: {' '.join(shown)}" if shown else "", style="dim")
    ranks = {name: rank_times(latest, name) for name in PHASES}
    by_rank = [
        f"{name} {'/'.join(f'{s:.2f}' for s in times)}s" for name, times in ranks.items() if times
    ]
    if per_gpu and by_rank:
        count = max(len(times) for times in ranks.values())
        text.append(f"  per GPU (ranks 0-{count - 1}): {' '.join(by_rank)}", style="dim")
    return text
