"""The process table: one row per supervised process, crash loops and failing probes in red.

Narrow enough for 100 columns: the role follows the name (dimmed) where it differs from it,
and the GPU memory column is added once a process has GPU memory sampled (NVML sees a GPU).
``weights`` says what each inference process serves (:meth:`RunState.served_weights`).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from grpo_tui.run_state import ProcessRow
from grpo_tui.supervisor.events import State

COLUMNS = (
    ("name", "name"),
    ("state", "state"),
    ("pid", "pid"),
    ("uptime", "up"),
    ("restarts", "restarts"),
    ("health", "health"),
    ("port", "port"),
    ("cpu", "CPU %"),
    ("rss", "RSS"),
    ("weights", "weights"),
)
GPU_COLUMN = ("gpu", "GPU mem")
"""Added once any process has GPU memory sampled."""

STATE_STYLES: dict[State, str] = {
    State.PENDING: "dim",
    State.STARTING: "yellow",
    State.RUNNING: "green",
    State.READY: "bold green",
    State.UNHEALTHY: "bold red",
    State.STOPPING: "yellow",
    State.KILLING: "red",
    State.BACKOFF: "bold magenta",
    State.COMPLETED: "blue",
    State.STOPPED: "dim",
    State.FAILED: "bold red",
}


def format_duration(seconds: float) -> str:
    """``1:02:03`` / ``2:03``: compact, fixed meaning."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{value:.0f}{unit}" if unit in ("B", "K") else f"{value:.1f}{unit}"
        value /= 1024
    return "-"


def row_cells(row: ProcessRow, now: float, serves: str | None = None) -> dict[str, Text]:
    """The cells of one row by column key, styled so that trouble shows at a glance;
    ``serves``: the weights an inference process serves (``v12``, ``pending``)."""
    crash = row.crash_looping(now)
    state_text = str(row.state)
    if crash:
        state_text += " ⟳ crash loop"
    alive = row.state in (State.STARTING, State.RUNNING, State.READY, State.UNHEALTHY)
    uptime = format_duration(now - row.started_at) if alive and row.started_at else "-"
    health = row.health or "-"
    pid = str(row.pid) if row.pid and alive else "-"
    port = str(row.port) if row.port else "-"
    if row.external is not None:  # not ours: its URL where the port goes, never a pid
        pid, port = "external", row.external.split("://", 1)[-1]
    name = Text(row.name, style="bold")
    if row.role not in (row.name, "process"):
        name.append(f" {row.role}", style="dim")
    cells = {
        "name": name,
        "state": Text(state_text, style=STATE_STYLES[row.state]),
        "pid": Text(pid, style="cyan" if row.external else ""),
        "uptime": Text(uptime),
        "restarts": Text(str(row.restarts), style="bold magenta" if row.restarts else ""),
        "health": Text(
            health, style="bold red" if health == "failing" else "green" if health == "ok" else ""
        ),
        "port": Text(port),
        "cpu": Text(f"{row.cpu_percent:.0f}" if row.cpu_percent is not None and alive else "-"),
        "rss": Text(format_bytes(row.rss_bytes) if alive else "-"),
        "weights": Text(serves or "-", style="yellow" if serves == "pending" else ""),
        "gpu": Text(format_bytes(row.gpu_memory_bytes) if alive else "-"),
    }
    if crash or health == "failing" or row.state is State.FAILED:
        for cell in cells.values():
            cell.stylize("on #5f0000")
    return cells


def _same(a: Text, b: Text) -> bool:
    return a.plain == b.plain and a.style == b.style and a.spans == b.spans


class ProcessTable(DataTable[Text]):
    """Rows keyed by process name; updated in place so the cursor stays on its process."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(
        self, rows: list[ProcessRow], now: float, served: dict[str, str] | None = None
    ) -> None:
        """Bring the table in line with ``rows`` (adds new processes, updates changed cells);
        ``served``: :meth:`RunState.served_weights`."""
        served = served or {}
        if "gpu" not in self.columns and any(r.gpu_memory_bytes is not None for r in rows):
            key, label = GPU_COLUMN
            self.add_column(label, key=key, default=Text("-"))
        keys = [column.value for column in self.columns]
        for row in rows:
            cells = row_cells(row, now, served.get(row.name))
            if row.name not in self.rows:
                self.add_row(*(cells[key] for key in keys), key=row.name)
                continue
            for key in keys:
                if not _same(self.get_cell(row.name, key), cells[key]):
                    self.update_cell(row.name, key, cells[key], update_width=True)

    @property
    def selected(self) -> str | None:
        """Name of the process under the cursor."""
        if not self.row_count:
            return None
        key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return key.value
