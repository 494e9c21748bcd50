"""A process that is not ours (``spec.External``, a server attached by URL) under a real
supervisor: its life attaches (the attach command, ours), probes it at its URL and lets it
go; nothing the supervisor does (stop, kill, restart, signal, its loss and return, the
run's end) ever signals it, and the detach command runs once, at the run's end."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import alive, child, free_port, spec

from grpo_tui.supervisor.events import Restarting, State
from grpo_tui.supervisor.spec import External, HttpProbe, LogLineProbe, ProcessSpec, RestartPolicy


def server(port: int) -> subprocess.Popen[bytes]:
    """The external process: an HTTP server this test starts, not the supervisor, returned
    once it accepts connections (an attach before that is a first, failed attempt: under
    CI's load the listener's start took longer than the supervisor's first attach)."""
    process = subprocess.Popen(child("listener.py", "--port", port), start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            assert process.poll() is None, f"the test's listener exited {process.returncode}"
            assert time.monotonic() < deadline, f"the test's listener on {port} never listened"
            time.sleep(0.05)


def external_spec(url: str, record: Path) -> ProcessSpec:
    return spec(
        "server",
        child("attacher.py", url, record),
        external=External(url=url, detach=child("attacher.py", url, record, "--detach")),
        readiness=LogLineProbe(pattern=r"^attached to "),
        liveness=HttpProbe(url=f"{url}/health", period=0.2, timeout=1, failure_threshold=2),
        restart=RestartPolicy(policy="always", backoff_base=0.2, backoff_cap=0.5, max_restarts=50),
    )


def test_an_external_spec_has_nothing_of_ours() -> None:
    for ours in ({"port": 9}, {"prestart": True}, {"slurm_step": "s"}):
        with pytest.raises(ValueError, match="is external"):
            spec("x", ["true"], external=External(url="http://h:1"), **ours)


@pytest.mark.timeout(120)
async def test_an_external_process_is_attached_probed_and_never_signalled(
    supervise, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    record = tmp_path / "record.txt"
    first = server(port)
    servers = [first]
    try:
        h = supervise([external_spec(url, record)])
        ready = await h.state("server", State.READY)
        assert ready.pid is None
        status = h.sup.status()["server"]
        assert (status.pid, status.external, status.down_since) == (None, url, None)
        with pytest.raises(ProcessLookupError):
            await h.sup.signal("server", signal.SIGTERM)

        await h.sup.restart("server")  # let go and attached again: no signal, no detach
        await h.sup.kill("server")
        assert h.sup.status()["server"].state is State.STOPPED
        await h.sup.start("server")
        await h.sup.wait_ready("server")
        assert alive([first.pid]) == [first.pid], "a stop, a kill or a restart reached it"
        assert record.read_text().splitlines() == [f"attached to {url}"] * 3

        first.kill()  # lost: its liveness probe fails, the life attaches again and again
        first.wait()
        lost = await h.until(lambda e: isinstance(e, Restarting) and e.process == "server")
        assert isinstance(lost, Restarting)
        assert lost.reason.startswith("liveness probe failed"), lost.reason
        assert h.sup.status()["server"].down_since is not None
        await h.until(lambda _: "unreachable" in record.read_text())
        back = server(port)
        servers.append(back)
        again = await h.until(
            lambda e: getattr(e, "new", None) == State.READY and e.t > lost.t, timeout=30
        )
        assert getattr(again, "incarnation", 0) == 4  # attached 3 times before, once now
        assert h.sup.status()["server"].down_since is None
        await h.close()
        assert record.read_text().splitlines()[-1] == "detached"
        assert record.read_text().count("detached") == 1
        assert alive([back.pid]) == [back.pid], "the run's end reached the external process"
    finally:
        for process in servers:
            process.kill()
            process.wait()
