"""Hyperparameters changed while a run goes on (``grpo-tui edit``, ``e`` on the dashboard).

The supervisor's role layer validates an edit with the role's own settings model (the
same pydantic models and checks as the profile), keeps it for every later restart, and
writes the values in force to ``<run dir>/live_edits.json``. Each running process reads
that file at its next step boundary through :class:`EditWatcher` (the trainer before each
optimizer step, an environment before each group, the API whenever it tells environments
whether to pause), and a restarted or resumed process at its start. Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from grpo_trainer.control import RUN_DIR_ENV
from grpo_trainer.run_notices import NoticeWatcher

EDITS_FILE = "live_edits.json"
EDITABLE: dict[str, str] = {
    "lr": "trainer",
    "lora_lr": "trainer",
    "beta": "trainer",
    "clip_eps": "trainer",
    "clip_eps_high": "trainer",
    "entropy_coef": "trainer",
    "tis_cap": "trainer",
    "temperature": "env",
    "max_batches_offpolicy": "api",
}
"""Each editable key (the field name in its role's settings) and the role that uses it."""


class Edit(BaseModel):
    """One accepted edit: when, and the values it set."""

    t: float
    values: dict[str, Any]


class EditsInForce(BaseModel):
    """The file's content: the values in force now and every edit that led to them."""

    version: int = 0
    values: dict[str, Any] = Field(default_factory=dict)
    history: list[Edit] = Field(default_factory=list)


def edits_path(run_dir: Path) -> Path:
    return run_dir / EDITS_FILE


def read_edits(run_dir: Path) -> EditsInForce:
    """The run's edits (none when the file is absent or unreadable)."""
    try:
        return EditsInForce.model_validate_json(edits_path(run_dir).read_bytes())
    except (OSError, ValidationError):
        return EditsInForce()


def record_edit(run_dir: Path, values: Mapping[str, Any], t: float | None = None) -> EditsInForce:
    """Merge ``values`` into the run's file (written whole, then renamed into place)."""
    current = read_edits(run_dir)
    merged = EditsInForce(
        version=current.version + 1,
        values={**current.values, **values},
        history=[*current.history, Edit(t=t or time.time(), values=dict(values))],
    )
    path = edits_path(run_dir)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(merged.model_dump(mode="json"), indent=1))
    os.replace(partial, path)
    return merged


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``key=value`` words as typed (``grpo-tui edit``, the dashboard's dialog): numbers as
    numbers, ``none`` / ``null`` as None (unset ``tis_cap``); the settings models check them.
    """
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key or not text:
            raise ValueError(f"expected key=value, got {item!r}")
        if text.lower() in ("none", "null"):
            values[key] = None
            continue
        try:
            values[key] = json.loads(text)
        except ValueError:
            values[key] = text
    if not values:
        raise ValueError(f"nothing to edit; editable: {', '.join(EDITABLE)}")
    return values


def unknown_keys(keys: Iterable[str]) -> list[str]:
    return sorted(key for key in keys if key not in EDITABLE)


class EditWatcher:
    """The values of ``keys`` in force in this run, re-read only when the file changed.

    ``poll`` is one ``stat`` when nothing changed, so it can run at every step boundary.
    Without a run directory (no supervisor) it never reports anything.
    """

    def __init__(self, keys: Iterable[str], run_dir: Path | None) -> None:
        self.keys = tuple(keys)
        self.file = NoticeWatcher(None if run_dir is None else edits_path(run_dir), EditsInForce)
        self._version = 0

    @classmethod
    def for_role(cls, role: str) -> EditWatcher:
        """A watcher of ``role``'s keys in ``$GRPO_TUI_RUN_DIR`` (set by the supervisor)."""
        run_dir = os.environ.get(RUN_DIR_ENV)
        keys = [key for key, owner in EDITABLE.items() if owner == role]
        return cls(keys, Path(run_dir) if run_dir else None)

    def poll(self) -> dict[str, Any] | None:
        """This role's values in force when the file changed since the last poll, else None."""
        edits = self.file.current()
        if edits is None or edits.version == self._version:
            return None
        self._version = edits.version
        values = {key: edits.values[key] for key in self.keys if key in edits.values}
        return values or None
