"""One chart of one or more metric series, redrawn from a snapshot when its data changed.

Drawn as text by :mod:`grpo_tui.widgets.braille_plot` (braille lines, value and step axes,
several series, reference lines), in one widget a chart. The charts never redraw per
event: the dashboard calls :meth:`MetricChart.redraw` on a timer, and a chart scrolled out
of view is left for when it comes back into view.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from rich.console import Group, RenderableType
from textual.widget import Widget
from textual_plot import NumericAxisFormatter

from grpo_trainer.records.timeline import SYNC_SPLIT
from grpo_trainer.train.phases import PHASES
from grpo_tui.alerts import (
    ALIGNMENT_DIFF_MAX,
    CLIPPED_FRACTION_MAX,
    MEAN_RATIO_BAND,
    MISMATCH_KL_MAX,
)
from grpo_tui.run_state import Point, SeriesStore
from grpo_tui.widgets.braille_plot import Y_LABELS, Line, chart_rows

PALETTE = ("cyan", "magenta", "yellow", "green", "red", "blue")
UNSIZED_BUCKETS = 120
"""Downsampling buckets per series before the chart's width is known (then: its dots across)."""


@dataclass(frozen=True)
class ChartSpec:
    """What one chart shows.

    ``names`` are exact metric names; ``prefixes`` add every metric starting with one of
    them (per-device GPU memory, eval pass@k), and ``fallback_prefixes`` are used only when
    nothing else has data (process RSS when there is no GPU): the chart is then titled
    ``fallback_title`` with ``fallback_unit``, so one chart never mixes units. ``lines`` are
    horizontal reference lines (healthy-band edges); ``labels`` short names for the title;
    ``x`` is ``"step"`` or ``"time"`` (seconds since start); ``unit`` follows each value.
    """

    id: str
    title: str
    names: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    fallback_prefixes: tuple[str, ...] = ()
    lines: tuple[float, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    x: str = "step"
    unit: str = ""
    fallback_title: str = ""
    fallback_unit: str = ""

    def series_names(self, store: SeriesStore) -> list[str]:
        names = store.names()
        chosen = [n for n in self.names if n in names]
        if self.prefixes:
            chosen += [n for n in names if n not in chosen and n.startswith(self.prefixes)]
        if not chosen and self.fallback_prefixes:
            chosen = [n for n in names if n.startswith(self.fallback_prefixes)]
        return chosen

    def is_fallback(self, names: Sequence[str]) -> bool:
        """Whether ``names`` (from :meth:`series_names`) are the fallback series."""
        return bool(names) and all(n.startswith(self.fallback_prefixes) for n in names)


class StepAxisFormatter(NumericAxisFormatter):
    """Ticks at whole numbers only, labelled as integers: training steps."""

    def get_ticks(self, min_: float, max_: float, max_ticks: int = 8) -> list[float]:
        ticks = super().get_ticks(min_, max_, max_ticks)
        if len(ticks) < 2 or ticks[1] - ticks[0] >= 1:
            return ticks
        return [float(t) for t in range(math.ceil(min_), math.floor(max_) + 1)]

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        return [f"{tick:.0f}" for tick in ticks]


class ValueAxisFormatter(NumericAxisFormatter):
    """The library's labels without ``-0.000``: a tick that rounds to zero reads ``0``."""

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        labels = super().get_labels_for_ticks(ticks)
        return [label.lstrip("-") if float(label) == 0 else label for label in labels]


def padded_range(low: float, high: float, half: float) -> tuple[float, float]:
    """``(low, high)``, or ``half`` either side of it where it is one value (one point, a
    constant series), which the plot would otherwise stretch into a ±1e-6 axis."""
    if high - low > 1e-9 * max(1.0, abs(low), abs(high)):
        return low, high
    return low - half, high + half


def downsample(points: Sequence[Point], buckets: int) -> Sequence[Point]:
    """The first and last point, and the lowest and highest of each of ``buckets`` runs.

    A chart ``buckets`` braille dots wide shows no more than that, so a long run costs the
    same to draw as a short one; keeping each run's extremes keeps spikes and the envelope
    of a noisy series, which taking every n-th point would alias away. Order is kept.
    """
    if len(points) <= 2 * buckets:
        return points
    values = np.fromiter((point[2] for point in points), dtype=float, count=len(points))
    edges = np.linspace(0, len(points), buckets + 1).astype(int)
    keep = {0, len(points) - 1}
    for start, end in pairwise(edges.tolist()):
        run = values[start:end]
        keep |= {start + int(run.argmin()), start + int(run.argmax())}
    return [points[i] for i in sorted(keep)]


class MetricChart(Widget):
    """A titled chart; the border title carries the latest values, the border turns red on
    alert."""

    def __init__(self, spec: ChartSpec, *, t0: float = 0.0) -> None:
        super().__init__(id=f"chart-{spec.id}", classes="chart")
        self.spec = spec
        self.t0 = t0
        self._signature: tuple[object, ...] | None = None
        self._data: dict[str, list[Point]] = {}
        self._renderable: RenderableType = ""
        self.border_title = spec.title
        self.x_format: NumericAxisFormatter = (
            StepAxisFormatter() if spec.x == "step" else NumericAxisFormatter()
        )
        self.y_format = ValueAxisFormatter()

    def show_spec(self, spec: ChartSpec) -> None:
        """Chart another set of series from the next :meth:`redraw` on."""
        self.spec = spec
        self.border_title = spec.title
        self.x_format = StepAxisFormatter() if spec.x == "step" else NumericAxisFormatter()
        self._signature = None

    @property
    def dots_across(self) -> int:
        """Braille dots across the plotting area (:data:`UNSIZED_BUCKETS` before layout)."""
        width = self.content_region.width - Y_LABELS - 1
        return 2 * width if width > 0 else UNSIZED_BUCKETS

    def redraw(self, store: SeriesStore) -> bool:
        """Draw the current data if it changed since the last call; True if it redrew."""
        names = self.spec.series_names(store)
        data = {name: store.series(name) for name in names}
        signature = tuple((n, len(p), p[-1] if p else None) for n, p in data.items())
        if signature == self._signature:
            return False
        self._signature = signature
        self._data = data
        self.border_title = self._title(data)
        self._draw()
        return True

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        """Lay the last data out at the current size."""
        lines: list[Line] = []
        xs_all: list[float] = []
        ys_all: list[float] = []
        for index, points in enumerate(self._data.values()):
            shown = downsample(points, self.dots_across)
            xs = np.array([self._x(p) for p in shown], dtype=float)
            ys = np.array([p[2] for p in shown], dtype=float)
            xs_all += xs.tolist()
            ys_all += ys.tolist()
            lines.append(Line(xs, ys, PALETTE[index % len(PALETTE)]))
        size = self.content_region.size
        if not xs_all or not size:
            self._renderable = "" if xs_all else "[dim]no data[/]"
            self.refresh()
            return
        x_range = padded_range(min(xs_all), max(xs_all), 1.0)
        bands = [Line(np.array(x_range), np.array([y, y]), "green") for y in self.spec.lines]
        ys_all += self.spec.lines
        low, high = min(ys_all), max(ys_all)
        y_range = padded_range(low, high, 0.1 * abs(high) or 1.0)
        rows = chart_rows(
            [*bands, *lines],
            x_range,
            y_range,
            (size.width, size.height),
            self.x_format,
            self.y_format,
        )
        self._renderable = Group(*rows)
        self.refresh()

    def render(self) -> RenderableType:
        return self._renderable

    @property
    def axis_text(self) -> tuple[str, str]:
        """The drawn (bottom axis labels, value labels), for tests."""
        rows = list(self._renderable.renderables) if isinstance(self._renderable, Group) else []
        if len(rows) < 2:
            return "", ""
        values = "\n".join(str(row)[:Y_LABELS] for row in rows[:-2])
        return str(rows[-1]), values

    def _x(self, point: Point) -> float:
        t, step, _ = point
        if self.spec.x == "step" and step is not None:
            return float(step)
        return t - self.t0

    def _title(self, data: dict[str, list[Point]]) -> str:
        spec = self.spec
        labels = dict(spec.labels)
        title, unit = spec.title, spec.unit
        if spec.is_fallback(list(data)):
            title, unit = spec.fallback_title, spec.fallback_unit
        suffix = f" {unit}" if unit else ""
        if len(data) == 1 and not labels and not (spec.prefixes or spec.fallback_prefixes):
            (points,) = data.values()
            value = f"{points[-1][2]:.4g}{suffix}" if points else "[dim]no data[/]"
            return f"{title} {value}"
        parts = []
        for index, (name, points) in enumerate(data.items()):
            if points:
                short = labels.get(name) or name.rsplit("/", 1)[-1]
                color = PALETTE[index % len(PALETTE)]
                parts.append(f"[{color}]{short}[/] {points[-1][2]:.4g}{suffix}")
        values = "  ".join(parts) if parts else "[dim]no data[/]"
        return f"{title}: {values}"


DASHBOARD_CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec("loss", "loss", names=("loss",)),
    ChartSpec(
        "reward",
        "reward",
        names=("reward/mean",),
        prefixes=("eval/pass@",),
        labels=(("reward/mean", "mean"),),
    ),
    ChartSpec("mean_ratio", "mean_ratio", names=("mean_ratio",), lines=MEAN_RATIO_BAND),
    ChartSpec(
        "clipped_fraction", "clipped", names=("clipped_fraction",), lines=(CLIPPED_FRACTION_MAX,)
    ),
    ChartSpec(
        "alignment",
        "align |Δlogp|",
        names=("alignment/diff_abs_mean", "alignment/diff_abs_mean_lag0"),
        lines=(ALIGNMENT_DIFF_MAX,),
        labels=(("alignment/diff_abs_mean", "all"), ("alignment/diff_abs_mean_lag0", "lag0")),
    ),
    ChartSpec(
        "mismatch_kl",
        "mismatch_kl",
        names=("mismatch_kl", "mismatch_kl/lag0"),
        prefixes=("mismatch_kl/env/",),
        lines=(MISMATCH_KL_MAX,),
        labels=(("mismatch_kl", "all"), ("mismatch_kl/lag0", "lag0")),
    ),
    ChartSpec(
        "staleness",
        "staleness",
        prefixes=("staleness/lag", "staleness/negative"),
    ),
    ChartSpec(
        "queue",
        "queue",
        names=("api/queue_groups", "api/time_in_queue_s"),
        labels=(("api/queue_groups", "groups"), ("api/time_in_queue_s", "waited s")),
        x="time",
    ),
    ChartSpec(
        "throughput",
        "tok/s",
        names=("inference/tokens_per_s", "tokens_per_s"),
        labels=(("inference/tokens_per_s", "inference"), ("tokens_per_s", "trainer")),
        x="time",
    ),
    ChartSpec(
        "memory",
        "GPU memory",
        prefixes=("gpu_memory_gb/",),
        fallback_prefixes=("rss_mb/",),
        x="time",
        unit="GB",
        fallback_title="RSS",
        fallback_unit="MB",
    ),
    ChartSpec(
        "sync_time",
        "sync s",
        names=("sync_time", *(f"sync/split/{phase}_s" for phase in SYNC_SPLIT)),
        labels=(
            ("sync_time", "total"),
            *((f"sync/split/{phase}_s", phase[:5]) for phase in SYNC_SPLIT),
        ),
    ),
    ChartSpec(
        "phases",
        "step s",
        names=tuple(f"phase/{phase}_s" for phase in PHASES),
        labels=tuple((f"phase/{phase}_s", phase[:5]) for phase in PHASES),
    ),
)
"""The dashboard's chart grid, in reading order. ``staleness``: the share of each step's
sequences by lag (0, 1, 2, 3, 4+, negative: the mean lag, ``off_policy_lag``, is its
average); ``queue``: the groups waiting in the rollout API and how long the last batch's
groups waited (scraped from its ``/metrics``); ``sync s``: each sync's seconds, in total
and by phase (``sync/split/<phase>_s``: wake, pause, transfer, finish, resume); ``step s``:
the step's seconds in each of the trainer device's phases."""
