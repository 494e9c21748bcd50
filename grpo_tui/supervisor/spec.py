"""What the supervisor runs: one validated description per child process.

These models are the edge between a profile (TOML written by a person) and the supervisor.
Key names follow process-compose where a user would guess them (``depends_on`` with a
``condition``, probes with ``initial_delay`` / ``period`` / ``success_threshold``).
"""

from __future__ import annotations

import signal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Strict(BaseModel):
    """Base for profile-facing models: unknown keys are errors, not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(StrEnum):
    """When a dependent may start, relative to one of its dependencies."""

    STARTED = "process_started"
    HEALTHY = "process_healthy"
    COMPLETED = "process_completed_successfully"


class Dependency(Strict):
    condition: Condition = Condition.HEALTHY


class Need(Strict):
    """What a process cannot make progress without: at least ``at_least`` of ``any_of``
    still able to run (not failed for good)."""

    any_of: list[str] = Field(min_length=1)
    at_least: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _satisfiable(self) -> Need:
        if self.at_least > len(set(self.any_of)):
            raise ValueError(f"at_least {self.at_least} is more than {sorted(set(self.any_of))}")
        return self

    def describe(self) -> str:
        """``feeder-0`` alone, or ``at least 1 of feeder-0, feeder-1``."""
        names = ", ".join(self.any_of)
        return names if len(self.any_of) == 1 else f"at least {self.at_least} of {names}"


class ProbeTiming(Strict):
    initial_delay: float = Field(0.0, ge=0)
    period: float = Field(1.0, gt=0)
    timeout: float = Field(1.0, gt=0)
    success_threshold: int = Field(1, ge=1)
    failure_threshold: int = Field(3, ge=1)


class HttpProbe(ProbeTiming):
    """Healthy when ``GET url`` answers with a status in ``[200, 400)``."""

    kind: Literal["http"] = "http"
    url: str


class TcpProbe(ProbeTiming):
    """Healthy when a TCP connection to ``host:port`` opens."""

    kind: Literal["tcp"] = "tcp"
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)


class ExecProbe(ProbeTiming):
    """Healthy when ``command`` exits 0 within the timeout."""

    kind: Literal["exec"] = "exec"
    command: list[str] = Field(min_length=1)


class LogLineProbe(ProbeTiming):
    """Healthy once a line of the process's output matches ``pattern`` (a Python regex)."""

    kind: Literal["log_line"] = "log_line"
    pattern: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        import re

        re.compile(value)
        return value


Probe = Annotated[HttpProbe | TcpProbe | ExecProbe | LogLineProbe, Field(discriminator="kind")]


class ProgressProbe(ProbeTiming):
    """Does it still do its work: a process whose health check answers while its work is
    stuck (a server whose scheduler hangs) is found by asking it for a little work.

    Every ``period`` the Prometheus ``counters`` at ``metrics_url`` (summed over their
    label sets: completed requests) are read; once they have not grown for ``idle_after``
    seconds, ``POST url`` with the JSON ``body`` must answer 2xx within ``timeout``, and a
    pass counts as progress. ``failure_threshold`` failures in a row stop the process to
    restart it, as a liveness failure does. ``bearer_env`` names the variable of the
    process's environment holding the bearer token its requests need, if any.
    """

    kind: Literal["progress"] = "progress"
    url: str
    body: dict[str, Any] = Field(default_factory=dict)
    bearer_env: str | None = None
    metrics_url: str
    counters: list[str] = Field(min_length=1)
    idle_after: float = Field(gt=0)


class RestartPolicy(Strict):
    """Restart with exponential backoff: ``base * factor**n`` seconds, at most ``cap``.

    The count ``n`` resets once a run has lasted ``reset_after`` seconds; ``max_restarts``
    consecutive restarts without such a stable run mark the process failed.
    """

    policy: Literal["no", "on_failure", "always"] = "no"
    backoff_base: float = Field(1.0, gt=0)
    backoff_factor: float = Field(2.0, ge=1)
    backoff_cap: float = Field(30.0, gt=0)
    reset_after: float = Field(60.0, gt=0)
    max_restarts: int = Field(5, ge=0)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` (0-based)."""
        return min(self.backoff_cap, self.backoff_base * self.backoff_factor**attempt)


class Shutdown(Strict):
    signal: str = "SIGTERM"
    timeout: float = Field(10.0, gt=0)

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
        if not isinstance(getattr(signal, name, None), signal.Signals):
            raise ValueError(f"unknown signal {value!r}")
        return name

    @property
    def signum(self) -> signal.Signals:
        return signal.Signals[self.signal]


class External(Strict):
    """A process that is not ours, at ``url`` (a server attached by URL): the supervisor
    never spawns, stops or signals it (``external.py``).

    The spec's ``command`` then attaches to it: it is run at each start (and each time the
    process is back after a loss), and its readiness probe says when it is attached.
    ``detach``, when given, is run to completion when the run ends and lets it go (not on
    a restart or a loss), within the spec's shutdown timeout, whatever the attach command
    got to (it may have been stopped halfway).
    """

    url: str
    detach: list[str] | None = Field(None, min_length=1)


class ProcessSpec(Strict):
    """One child process: how to start it, when it is ready, how to keep it and stop it.

    ``metrics_url`` names a Prometheus endpoint (vLLM's ``/metrics``) that the supervisor
    scrapes for generated tokens/s (``<name>/tokens_per_s``). ``needs`` names the
    processes it cannot go on without once they fail for good (the run's
    ``on_needed_failure`` says what then happens). ``slurm_step`` is the
    job-step name (``srun --job-name``) of a process that runs as a Slurm step: stopping
    it, and the watchdog after a supervisor's death, also ``scancel`` the steps of that
    name by id. ``prestart``: spawned before its dependencies are met, it waits at its
    start gate (``grpo_trainer.start_gate``) after its imports. ``standby`` (needs
    ``prestart``): while it runs, one more incarnation waits at its gate, imports done, for
    the next start (``grpo_tui.supervisor.standby``). ``progress`` asks it for a little
    work when it has done none for a while (:class:`ProgressProbe`); it runs beside
    ``liveness`` once the process is ready. ``external``: a process that is not ours, which
    ``command`` attaches to (:class:`External`).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    role: str = "process"
    command: list[str] = Field(min_length=1)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    port: int | None = Field(None, ge=1, le=65535)
    metrics_url: str | None = None
    slurm_step: str | None = None
    depends_on: dict[str, Dependency] = Field(default_factory=dict)
    needs: list[Need] = Field(default_factory=list)
    readiness: Probe | None = None
    liveness: Probe | None = None
    progress: ProgressProbe | None = None
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    shutdown: Shutdown = Field(default_factory=Shutdown)
    prestart: bool = False
    standby: bool = False
    external: External | None = None

    @model_validator(mode="after")
    def _not_self_dependent(self) -> ProcessSpec:
        if self.name in self.depends_on:
            raise ValueError(f"process {self.name!r} depends on itself")
        if any(self.name in need.any_of for need in self.needs):
            raise ValueError(f"process {self.name!r} needs itself")
        if self.prestart and self.slurm_step is not None:
            raise ValueError(f"process {self.name!r}: prestart needs a local process (stdin)")
        if self.standby and not self.prestart:
            raise ValueError(
                f"process {self.name!r}: standby needs prestart (a standby waits at its start gate)"
            )
        if self.external is not None:
            ours = [key for key in ("port", "slurm_step") if getattr(self, key) is not None]
            ours += [key for key in ("prestart", "standby") if getattr(self, key)]
            if ours:
                raise ValueError(
                    f"process {self.name!r} is external (not ours): no {', '.join(ours)}"
                )
        return self
