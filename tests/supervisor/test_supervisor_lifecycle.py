"""Start order, readiness, restart policy and stopping, with real child processes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time

import httpx
import psutil
import pytest
from conftest import alive, child, free_port, spec

from grpo_tui.supervisor import probes
from grpo_tui.supervisor.clock import WALL
from grpo_tui.supervisor.events import ProbeResult, Restarting, State, StateChanged
from grpo_tui.supervisor.spec import HttpProbe, RestartPolicy, Shutdown, TcpProbe
from grpo_tui.supervisor.supervisor import ProcessFailed


def listen_time(lines: list[str]) -> float:
    return next(float(line.split()[-1]) for line in lines if line.startswith("listening at"))


async def test_dependents_start_once_their_dependencies_are_ready(supervise) -> None:
    """Each dependent is spawned after its dependency listens (it became ready), not
    before; that it is spawned the moment it does, with no wait between:
    ``test_lifecycle_machine.py``, on a fake clock."""
    rng = random.Random()
    ports = {name: free_port() for name in ("api", "inference", "trainer")}

    def server(name: str, **deps: str) -> object:
        return spec(
            name,
            child("listener.py", "--port", ports[name], "--delay", f"{rng.uniform(0.2, 1.0):.2f}"),
            port=ports[name],
            depends_on={dep: {"condition": cond} for dep, cond in deps.items()},
            readiness=HttpProbe(url=f"http://127.0.0.1:{ports[name]}/health", period=0.05),
        )

    specs = [
        server("api"),
        server("inference", api="process_healthy"),
        server("trainer", api="process_healthy", inference="process_healthy"),
    ]
    h = supervise(specs)
    await h.state("trainer", State.READY, timeout=30)
    for dependent, dependency in (("inference", "api"), ("trainer", "inference")):
        ready_at = listen_time(h.sup.recent_lines(dependency))
        spawned = next(e for e in h.changes(dependent) if e.new == State.STARTING)
        assert spawned.t >= ready_at, (dependent, spawned.t - ready_at)
    assert h.sup.status()["trainer"].health == "ok"


async def test_crash_restarts_with_growing_backoff_then_fails(supervise) -> None:
    """A real crashing child: the delays asked grow, then it fails for good. That each
    restart waits its delay and no more: ``test_lifecycle_machine.py``, on a fake clock."""
    crash = [sys.executable, "-c", "print('crashing'); raise SystemExit(3)"]
    policy = RestartPolicy(policy="on_failure", backoff_base=0.1, backoff_factor=2, max_restarts=3)
    h = supervise([spec("crashy", crash, restart=policy)], exit_with="crashy")
    outcome = await h.run_task
    assert outcome.exit_code != 0
    assert "crashy" in outcome.reason and "gave up after 3 restarts" in outcome.reason
    delays = [e.delay for e in h.events if isinstance(e, Restarting)]
    assert delays == [0.1, 0.2, 0.4]
    spawns = [e.pid for e in h.changes("crashy") if e.new == State.RUNNING]
    assert len(set(spawns)) == 4
    final = h.sup.status()["crashy"]
    assert final.state == State.FAILED and final.exit_code == 3 and final.restarts == 3


async def test_child_ignoring_sigterm_is_killed_after_timeout(supervise) -> None:
    h = supervise(
        [
            spec(
                "stubborn",
                child("stubborn.py"),
                readiness={"kind": "log_line", "pattern": "ignoring SIGTERM"},
                shutdown=Shutdown(timeout=0.5),
            )
        ]
    )
    await h.state("stubborn", State.READY)
    pid = h.sup.status()["stubborn"].pid
    assert pid is not None
    began = time.monotonic()
    await h.sup.stop("stubborn")
    took = time.monotonic() - began
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert took >= 0.5
    status = h.sup.status()["stubborn"]
    assert status.state == State.STOPPED and status.exit_code == -signal.SIGKILL


async def test_stop_leaves_no_descendant_even_a_setsid_one(supervise, tmp_path) -> None:
    pidfile = tmp_path / "family.pids"
    h = supervise(
        [
            spec(
                "family",
                child("family.py", pidfile),
                readiness={"kind": "log_line", "pattern": "family ready"},
            )
        ]
    )
    await h.state("family", State.READY)
    pids = [int(line) for line in pidfile.read_text().split()]
    assert len(alive(pids)) == 4
    assert os.getpgid(pids[3]) != pids[0], "the setsid grandchild left the group"
    await h.sup.stop("family")
    assert alive(pids) == []


async def test_command_not_found_fails_cleanly_and_is_not_retried(supervise) -> None:
    """Starting it again cannot help: FAILED at once, whatever the restart policy says."""
    policy = RestartPolicy(policy="on_failure", backoff_base=0.05, max_restarts=5)
    h = supervise(
        [spec("ghost", ["grpo-tui-no-such-command-xyz"], restart=policy)], exit_with="ghost"
    )
    outcome = await h.run_task
    changes = h.changes("ghost")
    (failed,) = [e for e in changes if e.new == State.FAILED]
    assert failed.reason == "command not found: grpo-tui-no-such-command-xyz: not retried"
    assert State.BACKOFF not in [e.new for e in changes]
    assert not any(isinstance(e, Restarting) for e in h.events)
    assert outcome.exit_code == 1 and "command not found" in outcome.reason
    assert "Traceback" not in "".join(e.reason for e in changes)


async def test_port_in_use_is_refused_naming_the_holder(supervise) -> None:
    port = free_port()
    holder = psutil.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=-3,
        stderr=-3,
    )
    try:
        deadline = time.monotonic() + 20
        while not any(
            c.status == psutil.CONN_LISTEN and c.laddr.port == port
            for c in holder.net_connections()
        ):
            assert time.monotonic() < deadline, "holder never listened"
            time.sleep(0.05)
        policy = RestartPolicy(policy="always", backoff_base=0.05, max_restarts=5)
        api = spec("api", child("listener.py", "--port", port), port=port, restart=policy)
        h = supervise([api], exit_with="api")
        outcome = await h.run_task
        (failed,) = [e for e in h.changes("api") if e.new == State.FAILED]
        assert f"pid {holder.pid}" in failed.reason and "http.server" in failed.reason
        assert failed.reason.endswith("not retried")
        assert not any(isinstance(e, Restarting) for e in h.events)
        assert outcome.exit_code == 1
    finally:
        holder.kill()
        holder.wait()


async def test_liveness_failure_restarts_the_process(supervise) -> None:
    port = free_port()
    probe = {"url": f"http://127.0.0.1:{port}/", "period": 0.1, "failure_threshold": 2}
    h = supervise(
        [
            spec(
                "server",
                child("listener.py", "--port", port, "--serve-for", "1.0"),
                readiness=HttpProbe(**probe),
                liveness=HttpProbe(**probe),
                restart=RestartPolicy(policy="on_failure", backoff_base=0.1, max_restarts=1),
                shutdown=Shutdown(timeout=2),
            )
        ]
    )
    await h.state("server", State.UNHEALTHY, timeout=30)
    assert any(isinstance(e, ProbeResult) and e.probe == "liveness" and not e.ok for e in h.events)
    restarting = await h.until(lambda e: isinstance(e, Restarting))
    assert "liveness probe failed" in restarting.reason
    ready_twice = await h.until(
        lambda e: (
            isinstance(e, StateChanged)
            and e.new == State.READY
            and len([c for c in h.changes("server") if c.new == State.READY]) == 2
        )
    )
    assert ready_twice.pid != h.changes("server")[1].pid
    assert h.sup.status()["server"].restarts == 1


async def test_restart_with_dependents_rebuilds_the_spec(supervise) -> None:
    ports = {"api": free_port(), "env": free_port()}
    seen: list[tuple[str, dict]] = []

    def server(name: str, delay: str = "0", **extra: object) -> object:
        return spec(
            name,
            child("listener.py", "--port", ports[name], "--delay", delay),
            readiness=TcpProbe(port=ports[name], period=0.05),
            **extra,
        )

    def respec(name: str, args: dict) -> object:
        seen.append((name, dict(args)))
        return server(name, delay=str(args["delay"]))

    h = supervise(
        [server("api"), server("env", depends_on={"api": {}})],
        respec=respec,
    )
    await h.state("env", State.READY)
    before = {n: s.pid for n, s in h.sup.status().items()}
    await h.sup.restart("api", with_dependents=True, args={"delay": 0.2})
    assert seen == [("api", {"delay": 0.2})]
    assert h.sup.status()["api"].state == State.READY
    await h.until(lambda _: len([e for e in h.changes("env") if e.new == State.READY]) == 2)
    after = {n: s.pid for n, s in h.sup.status().items()}
    assert after["api"] != before["api"] and after["env"] != before["env"]
    api_ready = [e for e in h.changes("api") if e.new == State.READY][-1]
    env_start = [e for e in h.changes("env") if e.new == State.STARTING][-1]
    assert env_start.t >= api_ready.t


async def test_a_restart_whose_process_dies_before_ready_fails_not_the_crash_restart(
    supervise,
) -> None:
    """The crash restart of an incarnation a restart started runs the refreshed spec, which
    is not what the restart asked for (a server on the newest checkpoint, not on a sync's
    weights): the restart must fail so that its caller asks again, not return on it."""
    port = free_port()
    policy = RestartPolicy(policy="on_failure", backoff_base=0.1)

    def server(args: dict) -> object:
        command = child("listener.py", "--port", port)
        if args.get("crash"):  # dies before it listens
            command = [sys.executable, "-c", "raise SystemExit(3)"]
        return spec("server", command, readiness=TcpProbe(port=port, period=0.05),
                    restart=policy)  # fmt: skip

    h = supervise([server({})], respec=lambda _name, args: server(args))
    await h.state("server", State.READY)
    with pytest.raises(ProcessFailed, match="exited before it became ready"):
        await h.sup.restart("server", args={"crash": True})
    status = h.sup.status()["server"]
    assert status.state == State.READY and status.restarts == 1  # the refreshed spec serves
    assert "listener.py" in " ".join(h.sup.spec("server").command)
    await h.sup.restart("server", args={"crash": False})  # ready as asked: no failure


async def test_a_readiness_wait_cancelled_as_its_connect_fails_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restart above once hung here for good (CI, 2026-11-26): its process died, the
    cancel of the readiness probe came as a connect to the dead port failed, and
    ``asyncio.wait_for`` (Python 3.11) returned the failure instead, so the probe went on
    and the life waited for it forever. Here the cancel comes at that moment every time."""
    waiting: list[asyncio.Task[None]] = []

    async def refused(host: str, port: int) -> None:
        asyncio.get_running_loop().call_soon(waiting[0].cancel)  # before the prober resumes
        raise ConnectionRefusedError(111, f"Connect call failed ('{host}', {port})")

    monkeypatch.setattr(asyncio, "open_connection", refused)
    client: asyncio.Future[httpx.AsyncClient] = asyncio.get_running_loop().create_future()
    prober = probes.HttpProber(lambda: client)
    probe = TcpProbe(port=free_port(), period=0.05)
    ready = probes.wait_ready(probe, prober, lambda *_: None, None, WALL)
    waiting.append(asyncio.create_task(ready))
    done, _ = await asyncio.wait(waiting, timeout=5)
    assert done and waiting[0].cancelled(), "the probe went on after its cancel"


async def test_exit_with_completion_ends_the_run_in_order(supervise) -> None:
    port = free_port()
    h = supervise(
        [
            spec(
                "server",
                child("listener.py", "--port", port),
                readiness=TcpProbe(port=port, period=0.05),
            ),
            spec(
                "job",
                [sys.executable, "-c", "print('working')"],
                depends_on={"server": {}},
            ),
        ],
        exit_with="job",
    )
    outcome = await h.run_task
    assert outcome.exit_code == 0 and "job completed" in outcome.reason
    assert h.sup.status()["server"].state == State.STOPPED
    events_file = (h.sup.run_dir / "events.jsonl").read_text()
    assert '"new": "completed"' in events_file and '"process": "job"' in events_file


@pytest.mark.parametrize("condition", ["process_completed_successfully", "process_started"])
async def test_dependency_conditions(supervise, condition: str) -> None:
    first = spec("first", [sys.executable, "-c", "import time; time.sleep(0.3)"])
    second = spec(
        "second", [sys.executable, "-c", "pass"], depends_on={"first": {"condition": condition}}
    )
    h = supervise([first, second], exit_with="second")
    assert (await h.run_task).exit_code == 0
    second_start = next(e for e in h.changes("second") if e.new == State.RUNNING).t
    ended = (State.COMPLETED, State.STOPPING)
    first_done = next(e for e in h.changes("first") if e.new in ended).t
    if condition == "process_started":
        assert second_start < first_done
    else:
        assert second_start >= first_done


async def test_failed_dependency_fails_its_dependents(supervise) -> None:
    h = supervise(
        [
            spec(
                "broken",
                [sys.executable, "-c", "import time; time.sleep(0.2); raise SystemExit(1)"],
                readiness=TcpProbe(port=free_port(), period=0.05),
            ),
            spec("after", [sys.executable, "-c", "pass"], depends_on={"broken": {}}),
        ],
        exit_with="after",
    )
    outcome = await h.run_task
    assert outcome.exit_code == 1
    assert "dependency broken failed" in h.sup.status()["after"].last_reason


async def test_a_clean_stop_never_shows_a_failing_liveness_probe(supervise) -> None:
    """Issue 35: a server stopped on request closes its HTTP side first and takes a while
    for the rest (the built-in server, vLLM); its liveness probe went on through the stop
    and reported it failing (and the process UNHEALTHY). The probes stop as the stop
    begins; health says nothing of a stopped process."""
    port = free_port()
    probe = HttpProbe(url=f"http://127.0.0.1:{port}/", period=0.05, failure_threshold=1)
    server = child("listener.py", "--port", port, "--linger-on-term", "1.0")
    h = supervise([spec("server", server, readiness=probe, liveness=probe)])
    await h.state("server", State.READY)
    await h.until(lambda e: isinstance(e, ProbeResult) and e.probe == "liveness" and e.ok)
    assert h.sup.status()["server"].health == "ok"
    await h.sup.stop("server")
    assert "stopped listening on SIGTERM" in h.sup.recent_lines("server")
    failing = [
        e for e in h.events if isinstance(e, ProbeResult) and e.probe == "liveness" and not e.ok
    ]
    assert failing == []
    assert [e.new for e in h.changes("server")][-2:] == [State.STOPPING, State.STOPPED]
    status = h.sup.status()["server"]
    assert (status.state, status.health, status.exit_code) == (State.STOPPED, None, 0)
