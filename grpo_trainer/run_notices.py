"""What the supervisor's GRPO stack tells running processes through its run directory.

Two small JSON files, each written whole and renamed into place, read by a stat-cached
watcher (one ``stat`` when nothing changed, so it runs at every step boundary):

- ``inference.json`` (:class:`InferenceLife`): the inference server's incarnation (one more
  each time it becomes ready) and whether it is up. The trainer re-attaches its weight
  path (new transfer group, IPC handles, adapter, reload) when a new incarnation is up;
  the rollout API holds the environments (``pause``) from the moment inference goes down
  until the trainer reports weights served by the new incarnation, so that nothing is
  sampled from a restarted server's stale weights.
- ``mode_switch.json`` (:class:`ModeSwitch`): a weight-sync mode switch asked of the
  trainer, with the command line it would be started with in the new mode; the trainer
  switches in place at its next step boundary (``train/switch.py``).

Without a run directory (no supervisor) nothing is written and the watchers see nothing.
Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, Field, ValidationError

from grpo_trainer.control import RUN_DIR_ENV

INFERENCE_FILE = "inference.json"
MODE_SWITCH_FILE = "mode_switch.json"

NoticeT = TypeVar("NoticeT", bound=BaseModel)


class InferenceLife(BaseModel):
    """The inference server as the supervisor saw it last."""

    incarnation: int = Field(0, ge=0)
    """How many times it became ready in this run (its first start is 1)."""
    up: bool = False
    pid: int | None = None
    t: float = 0.0


class ModeSwitch(BaseModel):
    """A weight-sync mode switch asked of the running trainer."""

    serial: int = Field(ge=1)
    mode: str
    argv: list[str]
    """The trainer's flags in the new mode (what a restart would start it with)."""


class ModeSwitched(BaseModel):
    """The trainer's answer (a control-socket request ``mode_switched``)."""

    serial: int
    mode: str
    step: int
    seconds: float
    error: str | None = None


def write_notice(path: Path, notice: BaseModel) -> None:
    """Write ``notice`` to ``path`` whole, then rename it into place."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(notice.model_dump_json())
    os.replace(partial, path)


def run_dir() -> Path | None:
    """``$GRPO_TUI_RUN_DIR``, set by the supervisor for its children."""
    value = os.environ.get(RUN_DIR_ENV)
    return Path(value) if value else None


class NoticeWatcher(Generic[NoticeT]):
    """The notice in one file, re-read only when the file changed."""

    def __init__(self, path: Path | None, model: type[NoticeT]) -> None:
        self.path = path
        self.model = model
        self._seen: tuple[int, int] | None = None
        self._notice: NoticeT | None = None

    @classmethod
    def in_run(cls, name: str, model: type[NoticeT]) -> NoticeWatcher[NoticeT]:
        """A watcher of ``name`` in ``$GRPO_TUI_RUN_DIR`` (none without a supervisor)."""
        directory = run_dir()
        return cls(None if directory is None else directory / name, model)

    def current(self) -> NoticeT | None:
        """The notice in force (None: no file, or one that does not parse)."""
        if self.path is None:
            return None
        try:
            stat = self.path.stat()
        except OSError:
            return None
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._seen = seen
            try:
                self._notice = self.model.model_validate_json(self.path.read_bytes())
            except (OSError, ValidationError):
                self._notice = None
        return self._notice


class IncarnationWatch:
    """Which inference incarnation a process last attached to, and whether a newer one is up.

    ``adopt`` takes the incarnation up now as the one attached to (read before attaching, so
    that a server restarted meanwhile shows as a newer one); after a sync that restarted
    inference itself, ``started`` takes the incarnation the supervisor's reply named (the
    file may already show a later one: that crash restart serves other weights).
    """

    def __init__(self, watcher: NoticeWatcher[InferenceLife] | None = None) -> None:
        self.watcher = watcher or NoticeWatcher.in_run(INFERENCE_FILE, InferenceLife)
        self.attached: int | None = None
        self.adopted_down = False
        """``adopt`` found inference down (a process restarted while inference was): no
        incarnation was reported to the rollout API, which holds the environments until
        one is, so the next one up must be attached to as a restart."""

    def life(self) -> InferenceLife | None:
        return self.watcher.current()

    def adopt(self) -> int | None:
        """The incarnation up now becomes the attached one; returns it (None: no supervisor,
        or none up yet)."""
        life = self.life()
        if life is not None and life.up:
            self.attached = life.incarnation
        self.adopted_down = self.attached is None and life is not None
        return self.attached

    def started(self, incarnation: int) -> None:
        """A restart this process asked for started ``incarnation`` (the supervisor's reply)."""
        self.attached = incarnation
        self.adopted_down = False

    def down(self) -> bool:
        """True while the supervisor says inference is not up."""
        life = self.life()
        return life is not None and not life.up

    def restarted(self) -> bool:
        """True when an incarnation other than the attached one is up. The first one seen
        by a process that attached before the supervisor's first word (it may start
        alongside inference, before the server is ready) is taken as the attached one;
        after ``adopt`` found inference down, the first one up is a restart."""
        life = self.life()
        if life is None or not life.up:
            return False
        if self.attached is None and not self.adopted_down:
            self.attached = life.incarnation
            return False
        return life.incarnation != self.attached
