"""The run header: run name, mode, step / total with a progress bar and ETA, elapsed time,
and (once the trainer reports it) the trainer device's phase with the last step's seconds
in each phase."""

from __future__ import annotations

from rich.console import RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from grpo_trainer.train.phases import CURRENT, PHASES, rank_times
from grpo_tui.run_state import RunState
from grpo_tui.widgets.process_table import format_duration


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
        if read_only:
            title.append("  (read-only view)", style="italic dim")
        if state.outcome:
            title.append(f"  finished: {state.outcome}", style="bold blue")
        title.append_text(phase_text(state))
        bar = Table.grid(padding=(0, 1), expand=True)
        bar.add_column(no_wrap=True)
        bar.add_column(ratio=1)
        bar.add_column(no_wrap=True)
        step_text = f"step {step if step is not None else '-'} / {total or '?'}"
        done = step or 0
        bar.add_row(
            Text(step_text, style="bold"),
            ProgressBar(total=float(total or 1), completed=float(done if total else 0)),
            Text(f"ETA {format_duration(eta)}" if eta is not None else "ETA -", style="dim"),
        )
        title.no_wrap, title.overflow = True, "ellipsis"
        table = Table.grid(expand=True)
        table.add_row(title)
        table.add_row(bar)
        self._renderable = table
        self.refresh()

    def render(self) -> RenderableType:
        return self._renderable


def phase_text(state: RunState) -> Text:
    """``  phase training  last step: generating 0.41s training 0.08s ...`` (empty before
    the trainer reports a phase)."""
    latest = state.metrics.latest
    index = latest.get(CURRENT)
    if index is None or not 0 <= int(index) < len(PHASES):
        return Text("")
    text = Text.assemble(("  phase ", "dim"), (PHASES[int(index)], "bold magenta"))
    spent = [(name, latest.get(f"phase/{name}_s")) for name in PHASES]
    shown = [f"{name} {seconds:.2f}s" for name, seconds in spent if seconds is not None]
    if shown:
        text.append(f"  last step: {' '.join(shown)}", style="dim")
    ranks = {name: rank_times(latest, name) for name in PHASES}
    by_rank = [
        f"{name} {'/'.join(f'{s:.2f}' for s in times)}s" for name, times in ranks.items() if times
    ]
    if by_rank:
        count = max(len(times) for times in ranks.values())
        text.append(f"  per GPU (ranks 0-{count - 1}): {' '.join(by_rank)}", style="dim")
    return text
