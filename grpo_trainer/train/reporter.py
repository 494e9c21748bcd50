"""Where the trainer's metrics and events go: supervisor socket, metrics.jsonl, wandb.

With a supervisor (``GRPO_TUI_SOCKET`` set) the supervisor writes the run's
``metrics.jsonl`` from the socket records, so the trainer writes a file only when told to
(``--metrics-file``). Without one, the trainer writes ``metrics.jsonl`` next to its
checkpoint folder. Records have the socket's shape: ``{"type": "metrics", "step", "t",
"data"}``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from grpo_trainer.control import SupervisorLink, report_event


class Reporter:
    """Send each step's metrics everywhere they are wanted; never block on a dead socket."""

    def __init__(
        self,
        link: SupervisorLink | None,
        metrics_path: Path | None,
        wandb_run: Any = None,
    ) -> None:
        self.link = link
        self.metrics_path = metrics_path
        self.wandb_run = wandb_run
        if metrics_path is not None:
            metrics_path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_run(
        cls,
        *,
        save_path: str,
        metrics_file: str | None,
        use_wandb: bool = False,
        wandb_project: str | None = None,
        wandb_group: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> Reporter:
        """The reporter a trainer process uses, from its flags and environment."""
        link = SupervisorLink.from_env()
        if metrics_file is not None:
            path: Path | None = Path(metrics_file)
        elif link is None:
            path = Path(save_path).resolve().parent / "metrics.jsonl"
        else:
            path = None
        run = None
        if use_wandb:
            import wandb

            run = wandb.init(project=wandb_project, group=wandb_group, config=config)
        return cls(link, path, run)

    def metrics(self, step: int, data: dict[str, float]) -> None:
        """Report one optimizer step's metrics."""
        if self.link is not None:
            self.link.send_metrics(step, data)
        if self.metrics_path is not None:
            record = {"type": "metrics", "step": step, "t": time.time(), "data": data}
            with self.metrics_path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log(data, step=step)

    def phase(self, step: int, data: dict[str, float]) -> None:
        """The device's phase as it changes (``phases.py``): live display only, so the
        supervisor gets it and files keep one metrics record per step."""
        if self.link is not None:
            self.link.send_metrics(step, data)

    def event(
        self, level: str, message: str, code: str = "", data: dict[str, Any] | None = None
    ) -> None:
        """Something a person should see: stderr (the process log) and the event log
        (``code`` and ``data``: what happened, for programs)."""
        report_event(self.link, level, message, code, data)

    def close(self) -> None:
        """Flush the socket queue briefly and finish wandb."""
        if self.link is not None:
            self.link.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
