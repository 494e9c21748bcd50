"""A sweep directory on disk: what it sweeps (``sweep.json``) and what happened (``journal.jsonl``).

Layout::

    SWEEP/sweep.json              profile, axes, cells and their overrides
    SWEEP/journal.jsonl           sweep_start / cell_start / cell_end records, append-only
    SWEEP/profiles/<cell>.toml    each cell's profile as last launched (overrides, ports)
    SWEEP/console/<cell>.log      each cell's ``grpo-tui run`` console output
    SWEEP/<cell>/                 each cell's run directory (a normal one: ``grpo-tui view``)
    SWEEP/attempts/<cell>-<n>/    run directories of attempts that did not finish

A cell is done once a ``cell_end`` with exit code 0 is journaled; a restarted sweep runs
every other cell again. On Slurm a cell is a batch job: ``cell_submit`` (its job id) comes
before ``cell_start`` (the job runs), and a job left behind by a sweep that died is
``detached`` until the next sweep watches it again. Nothing here imports textual or torch.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import BaseModel, ConfigDict, ValidationError

from grpo_tui.sweep.grid import Axis, Cell

SWEEP_FILE = "sweep.json"
JOURNAL_FILE = "journal.jsonl"

CellState = Literal["queued", "pending", "running", "done", "failed", "interrupted", "detached"]
"""``pending``: a Slurm job in the queue; ``detached``: a Slurm job no live sweep watches."""


class AxisRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    values: list[Any]
    texts: list[str]


class CellRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    overrides: dict[str, Any]


class SweepRecord(BaseModel):
    """``sweep.json``: enough to run the sweep again and to tell whether a restart matches."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    profile: str
    profile_sha256: str
    zip: bool
    axes: list[AxisRecord]
    cells: list[CellRecord]

    def same_sweep(self, other: SweepRecord) -> bool:
        return (self.profile_sha256, self.zip, self.cells) == (
            other.profile_sha256,
            other.zip,
            other.cells,
        )


class SweepDirError(ValueError):
    """A directory that is not a sweep, or holds another sweep than the one asked for."""


@dataclass
class CellStatus:
    """What the journal says about one cell."""

    cell: Cell
    state: CellState = "queued"
    attempts: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    ports: dict[str, int] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    job: str | None = None
    """The Slurm job id of the last attempt (None for a local cell)."""


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class SweepDir:
    """Reads and appends a sweep directory's records."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()

    @property
    def record_path(self) -> Path:
        return self.path / SWEEP_FILE

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL_FILE

    def run_dir(self, cell_id: str) -> Path:
        return self.path / cell_id

    def profile_path(self, cell_id: str) -> Path:
        return self.path / "profiles" / f"{cell_id}.toml"

    def console_path(self, cell_id: str) -> Path:
        return self.path / "console" / f"{cell_id}.log"

    @staticmethod
    def is_sweep(path: Path) -> bool:
        return (path / SWEEP_FILE).is_file()

    def read(self) -> SweepRecord:
        try:
            return SweepRecord.model_validate_json(self.record_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SweepDirError(f"{self.path}: not a sweep directory (no {SWEEP_FILE})") from None
        except (OSError, ValidationError) as error:
            raise SweepDirError(f"{self.record_path}: unreadable: {error}") from None

    def create_or_match(
        self, profile: Path, axes: list[Axis], cells: list[Cell], *, zipped: bool
    ) -> SweepRecord:
        """Write ``sweep.json`` for a new sweep, or check that the one here is the same sweep."""
        record = SweepRecord(
            profile=str(profile.resolve()),
            profile_sha256=file_sha256(profile),
            zip=zipped,
            axes=[AxisRecord(key=a.key, values=list(a.values), texts=list(a.texts)) for a in axes],
            cells=[CellRecord(id=c.id, overrides=c.overrides) for c in cells],
        )
        if self.record_path.is_file():
            existing = self.read()
            if not existing.same_sweep(record):
                raise SweepDirError(
                    f"{self.path} holds another sweep (profile {existing.profile}, "
                    f"{len(existing.cells)} cells); its profile or cells differ from these: "
                    "pass another --dir"
                )
            return existing
        self.path.mkdir(parents=True, exist_ok=True)
        self.record_path.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return record

    def append(self, event: str, **fields: Any) -> None:
        """Append one journal record (one line, flushed: a killed sweep loses nothing written)."""
        line = json.dumps({"t": time.time(), "event": event, **fields}, default=str)
        with self.journal_path.open("a", encoding="utf-8") as journal:
            journal.write(line + "\n")

    def journal(self) -> list[dict[str, Any]]:
        if not self.journal_path.is_file():
            return []
        records = []
        for line in self.journal_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if isinstance(record, dict):
                records.append(record)
        return records

    def statuses(self) -> dict[str, CellStatus]:
        """Each cell's state from the journal (``running`` only while the sweep is alive)."""
        record = self.read()
        out = {c.id: CellStatus(Cell(c.id, c.overrides)) for c in record.cells}
        alive = False
        for entry in self.journal():
            status = out.get(str(entry.get("cell")))
            kind = entry.get("event")
            if kind == "sweep_start":
                alive = _process_alive(entry.get("pid"), entry.get("create_time"))
                for earlier in out.values():  # the sweep before this one died
                    if earlier.state == "running" and earlier.job is None:
                        earlier.state = "interrupted"
            elif status is not None and kind in ("cell_start", "cell_submit"):
                if kind == "cell_start" and entry.get("job"):  # the submitted job runs
                    status.state = "running"
                    status.started_at = float(entry["t"])
                    continue
                status.state = "pending" if kind == "cell_submit" else "running"
                status.attempts += 1
                status.started_at = float(entry["t"]) if kind == "cell_start" else None
                status.ended_at = status.exit_code = None
                status.ports = dict(entry.get("ports") or {})
                status.gpus = list(entry.get("gpus") or [])
                status.job = entry.get("job")
            elif status is not None and kind == "cell_end":
                status.exit_code = int(entry.get("exit_code", -1))
                status.ended_at = float(entry["t"])
                status.state = "done" if status.exit_code == 0 else "failed"
                slurm_state = entry.get("slurm_state")
                if slurm_state == "CANCELLED":
                    status.state = "interrupted"
                elif slurm_state is not None and slurm_state != "COMPLETED":
                    status.state = "failed"
        if not alive:
            for status in out.values():
                if status.state in ("pending", "running"):
                    status.state = "detached" if status.job else "interrupted"
        return out


def _process_alive(pid: object, create_time: object) -> bool:
    if not isinstance(pid, int) or not isinstance(create_time, int | float):
        return False
    try:
        return abs(psutil.Process(pid).create_time() - create_time) < 0.01
    except psutil.Error:
        return False
