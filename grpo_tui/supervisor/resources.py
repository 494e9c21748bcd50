"""What a run holds while it is open, and how its children are spawned within it.

The watchdog's lifeline, the control socket (Unix, plus TCP for Slurm steps on other
nodes), and the HTTP client of probes and scrapes. Children get the run's environment: the
control socket, their name, the run directory and the run's tag, which the watchdog sweeps.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import httpx

from grpo_tui.supervisor.control import (
    CONTROL_SOCKET,
    ControlEndpoint,
    ControlServer,
    OnRequest,
    socket_path,
)
from grpo_tui.supervisor.journal import Journal
from grpo_tui.supervisor.lifeline import Lifeline
from grpo_tui.supervisor.logs import OutputSink
from grpo_tui.supervisor.process import GATE_ENV, ChildProcess
from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.tree import PROCESS_VAR, RUN_ID_VAR

CONTROL_TOKEN_VAR = "GRPO_TUI_CONTROL_TOKEN"


def _http_client() -> httpx.AsyncClient:
    """The client for https probes and metrics scrapes; built in a thread (loading CA
    certificates takes a few hundred ms) so that nothing waits for it at start."""
    return httpx.AsyncClient(trust_env=False)


class RunResources:
    """The lifeline, the control server and the HTTP client of one run."""

    def __init__(self, run_dir: Path, run_id: str, tcp: ControlEndpoint | None) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.tcp = tcp
        self.lifeline = Lifeline()
        self._control: ControlServer | None = None
        self._client: asyncio.Future[httpx.AsyncClient] | None = None

    async def open(
        self,
        journal: Journal,
        on_request: OnRequest,
        identify: Callable[[int], str | None],
        on_health: Callable[[str, bool, str], None],
    ) -> None:
        """Start the HTTP client's loading, the watchdog and the control server."""
        self._client = asyncio.ensure_future(asyncio.to_thread(_http_client))
        await self.lifeline.start(self.run_dir, self.run_id)
        self._control = ControlServer(
            socket_path(self.run_dir, self.run_id),
            on_metrics=journal.record_metrics,
            on_event=journal.publish,
            on_request=on_request,
            identify=identify,
            on_health=on_health,
            tcp=self.tcp,
        )
        await self._control.start()
        self._announce(self._control.path)

    def _announce(self, path: Path) -> None:
        """``run_dir/control.sock`` is where ``grpo-tui attach`` and ``edit`` look: a socket
        moved to the temp dir (the run directory's path too long for one) is linked there."""
        named = self.run_dir / CONTROL_SOCKET
        if path != named.resolve():
            named.unlink(missing_ok=True)
            named.symlink_to(path)

    async def close(self) -> None:
        named = self.run_dir / CONTROL_SOCKET
        if named.is_symlink():
            named.unlink()
        if self._control is not None:
            await self._control.close()
        if self._client is not None:
            await (await self._client).aclose()
        await self.lifeline.close()

    def client(self) -> asyncio.Future[httpx.AsyncClient]:
        assert self._client is not None, "the HTTP client is made when the run opens"
        return self._client

    async def spawn(
        self, spec: ProcessSpec, sink: OutputSink, tag: str | None = None
    ) -> ChildProcess:
        """Start one incarnation of ``spec`` in the run's environment, guarded by the watchdog
        (``tag``: the name it carries in its environment, the spec's unless given)."""
        return await ChildProcess.spawn(
            spec,
            env=self.child_env(spec, tag),
            run_id=self.run_id,
            sink=sink,
            announce=self.lifeline.announce,
            tag=tag,
        )

    def child_env(self, spec: ProcessSpec, tag: str | None = None) -> dict[str, str]:
        """A child's environment; a Slurm step (maybe on another node) gets the control
        socket's TCP side and its token when there is one."""
        assert self._control is not None
        control = {"GRPO_TUI_SOCKET": str(self._control.path)}
        if spec.slurm_step is not None and self.tcp is not None:
            control = {"GRPO_TUI_SOCKET": self.tcp.url, CONTROL_TOKEN_VAR: self.tcp.token}
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **spec.env,
            **control,
            PROCESS_VAR: tag or spec.name,
            **({GATE_ENV: "stdin"} if spec.prestart else {}),
            "GRPO_TUI_RUN_DIR": str(self.run_dir.resolve()),
            RUN_ID_VAR: self.run_id,
        }
