"""Settings of the rollout API: what a profile's ``[api]`` table maps onto.

Torch-free on purpose: ``grpo-tui check`` imports it to validate a profile quickly. The
same model backs the command line (``python -m grpo_trainer.api``), so a key in the
profile, a field here and a flag on the CLI carry one name (``max_batches_offpolicy`` is
``--max-batches-offpolicy``).
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

TOKEN_ENV = "GRPO_API_TOKEN"
"""Environment variable read for the token when ``--token`` is not given (keeps it out of ps)."""

MEMORY_DB = ":memory:"
"""``--db`` value for a non-durable queue (benchmarks, throwaway runs)."""

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiSettings(BaseModel):
    """How the rollout API listens, where it keeps its queue and which limits it enforces.

    ``db`` is usually left unset in a profile: the role layer passes ``RUN/rollouts.db``
    through ``argv(run_dir=...)``. Binding a non-loopback ``host`` requires a ``token``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    db: Path | None = None
    token: SecretStr | None = None
    max_batches_offpolicy: int = Field(
        3,
        ge=0,
        description=(
            "environments pause while the queue holds this many batches; 0 = synchronous: "
            "they also pause while the trainer holds a leased batch, until it acknowledges it"
        ),
    )
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_group_size: int = Field(256, ge=1)
    max_lease_seconds: float = Field(3600.0, gt=0)
    synchronous: Literal["full", "normal"] = "full"
    cors_origins: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ApiSettings:
        if not is_loopback(self.host) and self.token is None:
            raise ValueError(
                f"host {self.host!r} is not a loopback address: set token (or "
                f"{TOKEN_ENV}) so that only holders of the token can reach the queue"
            )
        if "*" in self.cors_origins:
            raise ValueError("cors_origins must list origins; '*' is not allowed")
        return self

    @property
    def url(self) -> str:
        """Base URL clients use (``--atropos-url`` / ``--api-url`` of the other roles)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def health_url(self) -> str:
        """Readiness probe target: 200 once the server accepts requests."""
        return f"{self.url}/health"

    def database(self, run_dir: Path | None = None) -> str:
        """The ``--db`` value: ``db`` if set, else ``run_dir/rollouts.db``."""
        if self.db is not None:
            return str(self.db)
        if run_dir is None:
            raise ValueError("api.db is unset and no run directory was given")
        return str(run_dir / "rollouts.db")

    def argv(self, run_dir: Path | None = None) -> list[str]:
        """Command line that starts this API: ``python -m grpo_trainer.api --host ...``.

        The token is not on it (anyone can read a command line): pass ``environment()``.
        """
        args = [
            sys.executable,
            "-m",
            "grpo_trainer.api",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--db",
            self.database(run_dir),
            "--max-batches-offpolicy",
            str(self.max_batches_offpolicy),
            "--max-body-bytes",
            str(self.max_body_bytes),
            "--max-group-size",
            str(self.max_group_size),
            "--max-lease-seconds",
            str(self.max_lease_seconds),
            "--synchronous",
            self.synchronous,
        ]
        for origin in self.cors_origins:
            args += ["--cors-origin", origin]
        return args

    def environment(self) -> dict[str, str]:
        """Environment for the API process: the token travels here, never on the argv (ps)."""
        if self.token is None:
            return {}
        return {TOKEN_ENV: self.token.get_secret_value()}
