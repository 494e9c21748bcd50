"""The GPU table: per GPU (NVML), which processes hold it, its memory and its utilisation.

Drawn from :attr:`RunState.gpus`; hidden where no GPU was ever sampled (a CPU-only machine,
or NVML missing), so a CPU run's dashboard is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from grpo_tui.supervisor.events import GpuSample

PER_ROW = 2
"""GPUs side by side on one line when there are more than two (8 GPUs: four lines)."""


def gpu_cells(gpu: GpuSample) -> list[Text]:
    """``GPU 0``, its holders, ``used/total GB``, ``util %`` (red from 95 % memory)."""
    used, total = gpu.memory_used_bytes / 1e9, gpu.memory_total_bytes / 1e9
    full = gpu.memory_total_bytes and gpu.memory_used_bytes >= 0.95 * gpu.memory_total_bytes
    return [
        Text(f"GPU {gpu.index}", style="bold"),
        Text(", ".join(gpu.holders) or "-", style="cyan" if gpu.holders else "dim"),
        Text(f"{used:.1f}/{total:.0f} GB", style="bold red" if full else ""),
        Text(f"{gpu.utilization_percent:.0f}%"),
    ]


def gpu_table(gpus: Mapping[int, GpuSample]) -> Table:
    """One grid row per GPU, or per :data:`PER_ROW` GPUs when there are more than two."""
    per_row = PER_ROW if len(gpus) > 2 else 1
    table = Table.grid(padding=(0, 2), expand=True)
    for _ in range(per_row):
        table.add_column(no_wrap=True)
        table.add_column(ratio=1, no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
        table.add_column(justify="right", no_wrap=True)
    ordered = [gpus[index] for index in sorted(gpus)]
    for start in range(0, len(ordered), per_row):
        cells: list[Text] = []
        for gpu in ordered[start : start + per_row]:
            cells += gpu_cells(gpu)
        table.add_row(*cells)
    return table


class GpuTable(Widget):
    """The latest GPU samples; :meth:`show` sets what to draw and hides the table when empty."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "GPUs"
        self._renderable: RenderableType = Text("")
        self.display = False

    def show(self, gpus: Mapping[int, GpuSample]) -> None:
        self.display = bool(gpus)
        if gpus:
            self._renderable = gpu_table(gpus)
            self.refresh(layout=True)

    def render(self) -> RenderableType:
        return self._renderable
