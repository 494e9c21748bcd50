"""The process life as a state machine, driven through ``Hooks`` with a fake spawn, a fake
prober and a fake clock (``fakes.py``): every edge of the table, every impossible change
refused, the restart policy, backoff and its resets, a stop in each state, a start after
each end, the standby, dependencies, and the probes (a clean stop never shows a failing
one; the progress probe restarts a process that answers its health check but does no
work). No child process and no wall clock: time moves when a test says."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from fakes import Machine, eventually, spec

from grpo_tui.supervisor.events import State, StateChanged
from grpo_tui.supervisor.process import SpawnError
from grpo_tui.supervisor.spec import HttpProbe, ProcessSpec, ProgressProbe, RestartPolicy
from grpo_tui.supervisor.transitions import EDGES, TransitionError, check, markdown_table

READY_URL = "http://fake/ready"
LIVE_URL = "http://fake/live"
READINESS = HttpProbe(url=READY_URL, period=1)
LIVENESS = HttpProbe(url=LIVE_URL, period=5, failure_threshold=1)
NO = RestartPolicy(policy="no")
ON_FAILURE = RestartPolicy(policy="on_failure", backoff_base=1, max_restarts=3)
ALWAYS = RestartPolicy(policy="always", backoff_base=1, max_restarts=3)

Make = Callable[..., Machine]


@pytest.fixture
async def machine(tmp_path: Path) -> AsyncIterator[Make]:
    made: list[Machine] = []

    def make(*specs: ProcessSpec) -> Machine:
        made.append(Machine(tmp_path / f"m{len(made)}", *(specs or (spec(),))))
        return made[-1]

    yield make
    for m in made:
        await m.close()


# ------------------------------------------------------------------ scenarios, one an edge


async def started(m: Machine, state: State = State.RUNNING) -> Machine:
    m.life().launch()
    await m.state(state)
    return m


async def ready(m: Machine) -> Machine:
    return await started(m, State.READY)


async def stopped(m: Machine) -> Machine:
    await m.life().stop()
    assert m.life().state is State.STOPPED
    return m


async def killed(m: Machine) -> Machine:
    """``Supervisor.kill``: the SIGKILL at once, then a stop that waits for the end."""
    await m.life().kill_now()
    await m.life().stop()
    assert m.life().state is State.STOPPED
    return m


async def exits(m: Machine, code: int, then: State) -> Machine:
    m.child().exit(code)
    await m.state(then)
    return m


async def backoff(make: Make) -> Machine:
    return await exits(await started(make(spec(restart=ON_FAILURE))), 1, State.BACKOFF)


async def unhealthy(make: Make, policy: RestartPolicy, then: State) -> Machine:
    m = await ready(make(spec(readiness=READINESS, liveness=LIVENESS, restart=policy)))
    await m.clock.asleep(LIVENESS.period)  # its first liveness check passed
    m.prober.failing.add(LIVE_URL)
    m.child().ignores_term = True
    await m.clock.tick(LIVENESS.period)
    await m.state(then)
    assert (State.READY, State.UNHEALTHY) in m.edges()
    return m


async def pending_forever(make: Make) -> Machine:
    """A dependent waiting for a dependency that never becomes ready."""
    m = make(spec("dep", readiness=READINESS), spec(depends_on={"dep": {}}))
    m.prober.failing.add(READY_URL)
    m.life("dep").launch()
    m.life().launch()
    await m.state(State.STARTING, "dep")
    return m


async def gated(make: Make, **fields: object) -> Machine:
    """A prestart process spawned at its closed gate, its dependency not ready."""
    m = make(
        spec("dep", readiness=READINESS), spec(prestart=True, depends_on={"dep": {}}, **fields)
    )
    m.prober.failing.add(READY_URL)
    m.life("dep").launch()
    m.life().launch()
    await m.state(State.STARTING)
    return m


async def edge_pending_starting(make: Make) -> Machine:
    return await started(make(spec(readiness=READINESS)), State.READY)


async def edge_pending_running(make: Make) -> Machine:
    return await started(make())


async def edge_pending_backoff(make: Make) -> Machine:
    m = make(spec(restart=ON_FAILURE))
    m.spawn.errors.append(SpawnError("cannot start fake: out of memory", permanent=False))
    m.life().launch()
    await m.state(State.BACKOFF)
    assert m.reasons()[-1] == "cannot start fake: out of memory; restart in 1 s"
    return m


async def edge_pending_failed(make: Make) -> Machine:
    m = make(spec(restart=ALWAYS))
    m.spawn.errors.append(SpawnError("command not found: fake"))
    m.life().launch()
    await m.state(State.FAILED)
    assert m.reasons()[-1] == "command not found: fake: not retried"
    return m


async def edge_pending_stopping(make: Make) -> Machine:
    return await stopped(await pending_forever(make))


async def edge_pending_killing(make: Make) -> Machine:
    return await killed(await pending_forever(make))


async def edge_starting_running(make: Make) -> Machine:
    m = await gated(make)
    m.prober.failing.clear()
    await m.clock.tick(READINESS.period)
    await m.state(State.RUNNING)
    assert m.child().gates == [None]
    return m


async def edge_starting_ready(make: Make) -> Machine:
    return await ready(make(spec(readiness=READINESS)))


async def not_ready(make: Make, policy: RestartPolicy) -> Machine:
    m = make(spec(readiness=READINESS, restart=policy))
    m.prober.failing.add(READY_URL)
    return await started(m, State.STARTING)


async def edge_starting_backoff(make: Make) -> Machine:
    return await exits(await not_ready(make, ON_FAILURE), 1, State.BACKOFF)


async def edge_starting_completed(make: Make) -> Machine:
    return await exits(await not_ready(make, ON_FAILURE), 0, State.COMPLETED)


async def edge_starting_failed(make: Make) -> Machine:
    return await exits(await not_ready(make, NO), 1, State.FAILED)


async def edge_starting_stopping(make: Make) -> Machine:
    return await stopped(await not_ready(make, ALWAYS))


async def edge_starting_killing(make: Make) -> Machine:
    m = await killed(await not_ready(make, ALWAYS))
    assert m.child().signals == [signal.SIGKILL]
    return m


async def edge_running_unhealthy(make: Make) -> Machine:
    m = await started(make(spec(liveness=LIVENESS, restart=ALWAYS)))
    await m.clock.asleep(LIVENESS.period)
    m.prober.failing.add(LIVE_URL)
    await m.clock.tick(LIVENESS.period)
    await m.state(State.BACKOFF)
    return m


async def edge_running_backoff(make: Make) -> Machine:
    return await backoff(make)


async def edge_running_completed(make: Make) -> Machine:
    return await exits(await started(make(spec(restart=ON_FAILURE))), 0, State.COMPLETED)


async def edge_running_failed(make: Make) -> Machine:
    return await exits(await started(make(spec(restart=NO))), 1, State.FAILED)


async def edge_running_stopping(make: Make) -> Machine:
    return await stopped(await started(make()))


async def edge_running_killing(make: Make) -> Machine:
    return await killed(await started(make()))


async def edge_ready_unhealthy(make: Make) -> Machine:
    return await unhealthy(make, ALWAYS, State.BACKOFF)


async def edge_ready_backoff(make: Make) -> Machine:
    m = await ready(make(spec(readiness=READINESS, restart=ALWAYS)))
    return await exits(m, -signal.SIGKILL, State.BACKOFF)


async def edge_ready_completed(make: Make) -> Machine:
    return await exits(await ready(make(spec(readiness=READINESS))), 0, State.COMPLETED)


async def edge_ready_failed(make: Make) -> Machine:
    return await exits(await ready(make(spec(readiness=READINESS))), 2, State.FAILED)


async def edge_ready_stopping(make: Make) -> Machine:
    return await stopped(await ready(make(spec(readiness=READINESS))))


async def edge_ready_killing(make: Make) -> Machine:
    return await killed(await ready(make(spec(readiness=READINESS))))


async def edge_unhealthy_backoff(make: Make) -> Machine:
    return await unhealthy(make, ALWAYS, State.BACKOFF)


async def edge_unhealthy_failed(make: Make) -> Machine:
    m = await unhealthy(make, NO, State.FAILED)
    assert m.reasons()[-1] == f"liveness probe failed: {LIVE_URL} refused"
    return m


async def edge_unhealthy_stopping(make: Make) -> Machine:
    m = await ready(make(spec(readiness=READINESS, liveness=LIVENESS, restart=ALWAYS)))
    m.child().slow_stop = asyncio.Event()
    await m.clock.asleep(LIVENESS.period)
    m.prober.failing.add(LIVE_URL)
    await m.clock.tick(LIVENESS.period)
    await m.state(State.UNHEALTHY)
    stop = asyncio.create_task(m.life().stop())
    await m.state(State.STOPPING)
    m.child().slow_stop.set()
    await stop
    assert m.path()[-3:] == [State.UNHEALTHY, State.STOPPING, State.STOPPED]
    assert len(m.spawn.children) == 1, "a stop during the restart's stop restarted it"
    return m


async def edge_unhealthy_killing(make: Make) -> Machine:
    """A kill while the process is stopped to restart: SIGKILL now, and no restart."""
    m = await ready(make(spec(readiness=READINESS, liveness=LIVENESS, restart=ALWAYS)))
    m.child().slow_stop = asyncio.Event()
    await m.clock.asleep(LIVENESS.period)
    m.prober.failing.add(LIVE_URL)
    await m.clock.tick(LIVENESS.period)
    await m.state(State.UNHEALTHY)
    await m.life().kill_now()
    assert m.child().returncode == -signal.SIGKILL, "the kill waited for the stop"
    m.child().slow_stop.set()
    await m.life().stop()
    assert m.path()[-3:] == [State.UNHEALTHY, State.KILLING, State.STOPPED]
    assert len(m.spawn.children) == 1, "a kill during the restart's stop restarted it"
    return m


async def edge_backoff_starting(make: Make) -> Machine:
    m = await ready(make(spec(readiness=READINESS, restart=ALWAYS)))
    await exits(m, 1, State.BACKOFF)
    await m.clock.tick(1)
    await m.state(State.READY)
    return m


async def edge_backoff_running(make: Make) -> Machine:
    m = await backoff(make)
    await m.clock.tick(1)
    await m.state(State.RUNNING)
    return m


async def edge_backoff_backoff(make: Make) -> Machine:
    m = await backoff(make)
    m.spawn.errors.append(SpawnError("cannot start fake: out of processes", permanent=False))
    await m.clock.tick(1)
    await m.clock.asleep(2)
    assert m.edges()[-1] == (State.BACKOFF, State.BACKOFF)
    return m


async def edge_backoff_failed(make: Make) -> Machine:
    m = await backoff(make)
    m.held["p"] = "port 9 is in use by pid 4242 (fake)"
    await m.clock.tick(1)
    await m.state(State.FAILED)
    assert m.reasons()[-1] == "port 9 is in use by pid 4242 (fake): not retried"
    return m


async def edge_backoff_stopping(make: Make) -> Machine:
    m = await stopped(await backoff(make))
    assert m.clock.sleeping == [], "the backoff's sleep outlived the stop"
    return m


async def edge_backoff_killing(make: Make) -> Machine:
    m = await killed(await backoff(make))
    assert m.clock.sleeping == [], "the backoff's sleep outlived the kill"
    return m


async def edge_stopping_stopped(make: Make) -> Machine:
    return await stopped(await started(make()))


async def edge_stopping_killing(make: Make) -> Machine:
    m = await started(make())
    m.child().slow_stop = asyncio.Event()
    stop = asyncio.create_task(m.life().stop())
    await m.state(State.STOPPING)
    await m.life().kill_now()
    assert m.child().returncode == -signal.SIGKILL, "the kill waited for the stop"
    m.child().slow_stop.set()
    await stop
    assert m.path()[-3:] == [State.STOPPING, State.KILLING, State.STOPPED]
    return m


async def edge_killing_stopped(make: Make) -> Machine:
    return await killed(await started(make()))


async def edge_stopped_pending(make: Make) -> Machine:
    m = await stopped(await started(make()))
    return await started(m)


async def edge_completed_pending(make: Make) -> Machine:
    m = await exits(await started(make()), 0, State.COMPLETED)
    await m.settled()
    return await started(m)


async def edge_failed_pending(make: Make) -> Machine:
    m = await exits(await started(make()), 1, State.FAILED)
    await m.settled()
    return await started(m)


SCENARIOS: dict[tuple[State, State], Callable[[Make], Awaitable[Machine]]] = {
    (State(old), State(new)): scenario
    for name, scenario in dict(globals()).items()
    if name.startswith("edge_")
    for old, new in [name.removeprefix("edge_").split("_")]
}


def test_every_edge_of_the_table_has_its_scenario_and_only_those() -> None:
    table = {(old, new) for old, edges in EDGES.items() for new in edges}
    assert set(SCENARIOS) == table


@pytest.mark.parametrize("edge", list(SCENARIOS), ids=lambda e: f"{e[0]}->{e[1]}")
async def test_each_edge(machine: Make, edge: tuple[State, State]) -> None:
    m = await SCENARIOS[edge](machine)
    assert edge in m.edges(), m.path()
    for old, new in m.edges():
        check("p", old, new)  # no change outside the table (transition() raised otherwise)


IMPOSSIBLE = [(old, new) for old in State for new in State if new not in EDGES[old]]


@pytest.mark.parametrize("pair", IMPOSSIBLE, ids=lambda p: f"{p[0]}->{p[1]}")
async def test_an_impossible_change_is_refused_naming_the_pair(machine: Make, pair) -> None:
    old, new = pair
    m = machine()
    life = m.life()
    life.state = old  # set by hand: the test's own way into any state
    with pytest.raises(TransitionError, match=f"p: {old} -> {new} is not a transition"):
        life.transition(new)
    assert life.state is old and not any(isinstance(e, StateChanged) for e in m.events)


# ------------------------------------------------------------------ the restart policy


@pytest.mark.parametrize(
    ("policy", "code", "then"),
    [
        ("no", 0, State.COMPLETED),
        ("no", 1, State.FAILED),
        ("on_failure", 0, State.COMPLETED),
        ("on_failure", 1, State.BACKOFF),
        ("on_failure", -signal.SIGKILL, State.BACKOFF),
        ("always", 0, State.BACKOFF),
        ("always", 1, State.BACKOFF),
    ],
)
async def test_restart_policy(machine: Make, policy: str, code: int, then: State) -> None:
    m = await started(machine(spec(restart=RestartPolicy(policy=policy))))
    await exits(m, code, then)
    assert bool(m.restarting()) == (then is State.BACKOFF)
    if then is State.FAILED:
        assert m.life().exit_code == code


async def test_backoff_grows_to_its_cap_and_restarts_exactly_when_it_is_over(
    machine: Make,
) -> None:
    """Replaces the wall-clock test of growing gaps between spawns: the sleeps asked are
    ``base * factor**n`` up to the cap, and the respawn comes when that time has passed,
    not before."""
    policy = RestartPolicy(policy="always", backoff_base=0.1, backoff_factor=2, backoff_cap=0.5)
    m = await started(machine(spec(restart=policy)))
    for n, delay in enumerate([0.1, 0.2, 0.4, 0.5, 0.5], start=1):
        m.child().exit(1)
        await m.clock.asleep(delay)
        m.clock.advance(delay * 0.99)
        await asyncio.sleep(0)
        assert m.life().state is State.BACKOFF and len(m.spawn.children) == n
        m.clock.advance(delay * 0.01 + 1e-9)
        await m.state(State.RUNNING)
        assert len(m.spawn.children) == n + 1
    assert m.clock.slept == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert [e.delay for e in m.restarting()] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert [e.attempt for e in m.restarting()] == [1, 2, 3, 4, 5]


async def test_max_restarts_in_a_row_fail_for_good(machine: Make) -> None:
    m = await started(machine(spec(restart=ON_FAILURE)))
    for delay in (1, 2, 4):
        await exits(m, 3, State.BACKOFF)
        await m.clock.tick(delay)
        await m.state(State.RUNNING)
    await exits(m, 3, State.FAILED)
    assert m.reasons()[-1] == "exited with code 3; gave up after 3 restarts"
    status = m.life().status()
    assert status.restarts == 3 and status.exit_code == 3
    assert m.clock.sleeping == []


async def test_a_run_of_reset_after_seconds_resets_the_count(machine: Make) -> None:
    """Each incarnation runs ``reset_after`` s before it crashes: the backoff stays at its
    base and ``max_restarts`` is never reached; crashing at once, the count grows."""
    policy = RestartPolicy(policy="on_failure", backoff_base=1, reset_after=60, max_restarts=2)
    m = await started(machine(spec(restart=policy)))
    for _ in range(4):
        m.clock.advance(60)
        await exits(m, 1, State.BACKOFF)
        await m.clock.tick(1)
        await m.state(State.RUNNING)
    assert [e.delay for e in m.restarting()] == [1, 1, 1, 1]
    m.clock.advance(59)  # one second short: the restart counts
    await exits(m, 1, State.BACKOFF)
    await m.clock.tick(2)
    await m.state(State.RUNNING)
    await exits(m, 1, State.FAILED)
    assert [e.delay for e in m.restarting()] == [1, 1, 1, 1, 2]
    assert m.reasons()[-1] == "exited with code 1; gave up after 2 restarts"
    assert m.life().restarts == 5


async def test_a_retryable_spawn_error_backs_off_and_is_never_failed(machine: Make) -> None:
    """``FAILED`` means failed for good: a spawn error that may pass goes to BACKOFF (a
    ``Restarting`` naming it), and the next spawn that works runs the process."""
    m = machine(spec(restart=ON_FAILURE))
    oom = SpawnError("cannot start fake: Cannot allocate memory", permanent=False)
    m.spawn.errors += [oom, oom]
    m.life().launch()
    await m.clock.asleep(1)
    m.clock.advance(1)
    await m.clock.asleep(2)
    m.clock.advance(2)
    await m.state(State.RUNNING)
    assert m.path() == [State.PENDING, State.BACKOFF, State.BACKOFF, State.RUNNING]
    assert [e.reason for e in m.restarting()] == [oom.reason, oom.reason]
    assert State.FAILED not in m.path()


async def test_a_retryable_spawn_error_fails_for_good_once_no_restart_is_left(
    machine: Make,
) -> None:
    m = machine(spec(restart=RestartPolicy(policy="always", max_restarts=1)))
    m.spawn.errors += [SpawnError("cannot start fake: EAGAIN", permanent=False)] * 2
    m.life().launch()
    await m.clock.asleep(1)
    m.clock.advance(1)
    await m.state(State.FAILED)
    assert m.path() == [State.PENDING, State.BACKOFF, State.FAILED]
    assert m.reasons()[-1] == "cannot start fake: EAGAIN; gave up after 1 restarts"


async def test_a_permanent_failure_is_not_retried_whatever_the_policy(machine: Make) -> None:
    """Replaces the wall-clock bound of the real tests (command not found, port in use):
    FAILED at once, without a backoff, a ``Restarting`` or a sleep."""
    m = machine(spec("p", restart=ALWAYS), spec("q", restart=ALWAYS))
    m.spawn.errors.append(SpawnError("command not found: fake"))
    m.held["q"] = "port 9 is in use by pid 4242 (fake)"
    m.life("p").launch()
    m.life("q").launch()
    await m.state(State.FAILED, "p")
    await m.state(State.FAILED, "q")
    assert m.path("p") == m.path("q") == [State.PENDING, State.FAILED]
    assert m.restarting() == [] and m.clock.slept == [] and len(m.spawn.children) == 0


async def test_a_closing_run_restarts_nothing(machine: Make) -> None:
    m = await started(machine(spec(restart=ALWAYS)))
    m.closing = True
    m.child().exit(1)
    await m.state(State.BACKOFF)
    await m.life().stop()
    assert len(m.spawn.children) == 1 and m.life().state is State.STOPPED


async def test_a_crash_restart_runs_the_refreshed_spec(machine: Make) -> None:
    m = await started(machine(spec(restart=ALWAYS)))
    m.respec = lambda name: spec(name, restart=ALWAYS, env={"NEW": "1"})
    await exits(m, 1, State.BACKOFF)
    await m.clock.tick(1)
    await m.state(State.RUNNING)
    assert m.child().spec.env == {"NEW": "1"}


# ------------------------------------------------------------------ stop in each state


STOP_IN: dict[str, Callable[[Make], Awaitable[Machine]]] = {
    "pending": pending_forever,
    "gated": gated,
    "starting": lambda make: not_ready(make, ALWAYS),
    "running": lambda make: started(make()),
    "ready": lambda make: ready(make(spec(readiness=READINESS))),
    "backoff": backoff,
}


@pytest.mark.parametrize("where", list(STOP_IN))
async def test_a_stop_in_each_state_ends_stopped_with_nothing_left(machine: Make, where) -> None:
    m = await STOP_IN[where](machine)
    spawned = len(m.spawn.of("p"))
    before = m.life().state
    await m.life().stop()
    assert m.path()[-3:] == [before, State.STOPPING, State.STOPPED]
    assert all(child.returncode is not None for child in m.spawn.of("p"))
    if where not in ("pending", "backoff"):
        assert m.child().signals == [signal.SIGTERM]
    m.clock.advance(100)
    await asyncio.sleep(0)
    assert len(m.spawn.of("p")) == spawned and m.life().state is State.STOPPED
    assert not m.life().active


@pytest.mark.parametrize("where", list(STOP_IN))
async def test_a_kill_in_each_state_sigkills_and_ends_stopped(machine: Make, where) -> None:
    m = await STOP_IN[where](machine)
    spawned = len(m.spawn.of("p"))
    before = m.life().state
    await killed(m)
    assert m.path()[-3:] == [before, State.KILLING, State.STOPPED]
    assert all(child.returncode is not None for child in m.spawn.of("p"))
    if where not in ("pending", "backoff"):
        assert m.child().signals == [signal.SIGKILL], "no SIGTERM and grace period"
    m.clock.advance(100)
    await asyncio.sleep(0)
    assert len(m.spawn.of("p")) == spawned and not m.life().active


async def test_a_stop_while_spawning_stops_what_the_spawn_brings(machine: Make) -> None:
    m = machine()
    m.spawn.hold = asyncio.Event()
    m.life().launch()
    await m.spawn.started.wait()
    stop = asyncio.create_task(m.life().stop())
    await m.state(State.STOPPING)
    m.spawn.hold.set()
    await stop
    assert m.path() == [State.PENDING, State.STOPPING, State.STOPPED]
    assert m.child().signals == [signal.SIGTERM] and m.child().returncode == -signal.SIGTERM


async def test_a_kill_while_spawning_sigkills_what_the_spawn_brings(machine: Make) -> None:
    """``Supervisor.kill`` (``kill_now``, then a stop) while the spawn is in flight: the
    new child gets SIGKILL, not the stop's SIGTERM and grace period. Was: SIGTERM."""
    m = machine()
    m.spawn.hold = asyncio.Event()
    m.life().launch()
    await m.spawn.started.wait()
    await m.life().kill_now()
    stop = asyncio.create_task(m.life().stop())
    m.spawn.hold.set()
    await stop
    assert m.child().signals == [signal.SIGKILL] and m.child().returncode == -signal.SIGKILL
    assert m.path() == [State.PENDING, State.KILLING, State.STOPPED]


async def test_a_stop_of_a_child_ignoring_sigterm_ends_with_its_sigkill(machine: Make) -> None:
    m = await started(machine())
    m.child().ignores_term = True
    await m.life().stop()
    assert m.child().signals == [signal.SIGTERM, signal.SIGKILL]
    assert m.life().status().exit_code == -signal.SIGKILL


async def test_a_second_stop_while_stopping_waits_for_the_first(machine: Make) -> None:
    m = await started(machine())
    m.child().slow_stop = asyncio.Event()
    first = asyncio.create_task(m.life().stop())
    await m.state(State.STOPPING)
    second = asyncio.create_task(m.life().stop())
    await asyncio.sleep(0)
    assert not second.done()
    m.child().slow_stop.set()
    await asyncio.gather(first, second)
    assert m.path() == [State.PENDING, State.RUNNING, State.STOPPING, State.STOPPED]


@pytest.mark.parametrize("end", [State.COMPLETED, State.FAILED])
async def test_a_stop_after_the_end_changes_nothing(machine: Make, end: State) -> None:
    m = await exits(await started(machine()), 0 if end is State.COMPLETED else 1, end)
    await m.life().stop()
    assert m.life().state is end and m.path()[-1] is end


async def test_a_kill_cuts_a_slow_stop_short(machine: Make) -> None:
    m = await started(machine())
    m.child().slow_stop = asyncio.Event()
    stop = asyncio.create_task(m.life().stop())
    await m.state(State.STOPPING)
    await m.life().kill_now()
    m.child().slow_stop.set()
    await stop
    assert signal.SIGKILL in m.child().signals and m.life().state is State.STOPPED


async def test_a_stop_of_a_life_never_launched(machine: Make) -> None:
    m = machine()
    await m.life().stop()
    assert m.path() == [State.PENDING, State.STOPPING, State.STOPPED]


# ------------------------------------------------------------------ start after an end


@pytest.mark.parametrize("end", [State.COMPLETED, State.FAILED, State.STOPPED])
async def test_a_start_after_each_end_runs_a_new_incarnation(machine: Make, end: State) -> None:
    m = await started(machine(spec(restart=NO)))
    if end is State.STOPPED:
        await m.life().stop()
    else:
        await exits(m, 0 if end is State.COMPLETED else 1, end)
    await m.settled()
    m.life().launch()
    await m.state(State.RUNNING)
    assert m.path()[-3:] == [end, State.PENDING, State.RUNNING]
    assert m.reasons()[-2] == "start requested"
    assert len(m.spawn.children) == 2 and m.spawn.children[0] is not m.child()


async def test_a_start_after_failing_for_good_gets_its_restarts_again(machine: Make) -> None:
    """The count ``max_restarts`` caps restarts from the last start asked for: a process
    started again after it gave up is restarted again, not failed at its first crash."""
    policy = RestartPolicy(policy="always", max_restarts=1)
    m = await started(machine(spec(restart=policy)))
    await exits(m, 1, State.BACKOFF)
    await m.clock.tick(1)
    await m.state(State.RUNNING)
    await exits(m, 1, State.FAILED)
    await m.settled()
    m.life().launch()
    await m.state(State.RUNNING)
    await exits(m, 1, State.BACKOFF)
    assert m.restarting()[-1].attempt == 1


async def test_a_launch_while_the_life_runs_is_refused(machine: Make) -> None:
    m = await started(machine())
    with pytest.raises(RuntimeError, match="its life task still runs"):
        m.life().launch()


# ------------------------------------------------------------------ dependencies


async def test_a_dependent_spawns_the_moment_its_dependency_is_ready(machine: Make) -> None:
    """Replaces the wall-clock bound of the real dependency chain (spawned within 0.5 s of
    the readiness): the dependent is spawned on the dependency's change to READY, with no
    time passing and no sleep asked in between."""
    m = make_chain(machine)
    m.prober.failing.add(READY_URL)
    m.life("dep").launch()
    m.life().launch()
    await m.state(State.STARTING, "dep")
    assert m.life().state is State.PENDING and m.spawn.of("p") == []
    await m.clock.asleep(READINESS.period)
    now, asked = m.clock.t, len(m.clock.slept)
    m.prober.failing.clear()
    m.clock.advance(READINESS.period)
    await m.state(State.RUNNING)
    assert m.clock.t == now + READINESS.period and len(m.clock.slept) == asked
    ready_at = next(i for i, e in enumerate(m.events) if isinstance(e, StateChanged)
                    and e.process == "dep" and e.new is State.READY)  # fmt: skip
    spawned_at = next(i for i, e in enumerate(m.events) if isinstance(e, StateChanged)
                      and e.process == "p" and e.new is State.RUNNING)  # fmt: skip
    assert ready_at < spawned_at


def make_chain(machine: Make) -> Machine:
    return machine(spec("dep", readiness=READINESS), spec(depends_on={"dep": {}}))


@pytest.mark.parametrize("prestart", [False, True])
async def test_a_dependency_failing_for_good_fails_its_dependent(machine: Make, prestart) -> None:
    m = machine(
        spec("dep", readiness=READINESS, restart=NO),
        spec(prestart=prestart, depends_on={"dep": {}}),
    )
    m.prober.failing.add(READY_URL)
    m.life("dep").launch()
    m.life().launch()
    await m.state(State.STARTING, "dep")
    m.child("dep").exit(2)
    await m.state(State.FAILED)
    assert m.reasons()[-1] == "dependency dep failed: exited with code 2"
    if prestart:  # spawned at its gate: stopped, never let through
        assert m.path() == [State.PENDING, State.STARTING, State.FAILED]
        assert m.child().gates == [] and m.child().signals == [signal.SIGTERM]
    else:
        assert m.path() == [State.PENDING, State.FAILED] and m.spawn.of("p") == []


async def test_a_prestart_child_exiting_at_its_gate_follows_the_policy(machine: Make) -> None:
    m = await gated(machine, restart=ON_FAILURE)
    await exits(m, 1, State.BACKOFF)
    assert m.child().gates == []


async def test_a_gated_process_without_readiness_is_not_ready_before_its_gate(
    machine: Make,
) -> None:
    m = await gated(machine)
    assert not m.life().ready and m.life().state is State.STARTING


# ------------------------------------------------------------------ standby


def standby_spec(restart: RestartPolicy = ALWAYS) -> ProcessSpec:
    return spec(readiness=READINESS, prestart=True, standby=True, restart=restart)


async def with_standby(machine: Make, restart: RestartPolicy = ALWAYS) -> Machine:
    m = await ready(machine(standby_spec(restart)))
    await eventually(lambda: bool(m.spawn.of("p~standby1")))
    return m


async def test_a_ready_process_keeps_a_standby_and_a_crash_restart_adopts_it(
    machine: Make,
) -> None:
    m = await with_standby(machine)
    (spare,) = m.spawn.of("p~standby1")
    assert spare.gates == [] and spare.returncode is None
    await exits(m, 1, State.BACKOFF)
    await m.clock.tick(1)
    await m.state(State.READY)
    assert m.life().child is spare and spare.gates == [None]  # the same command: its own
    assert len(m.spawn.of("p")) == 1, "the restart spawned afresh instead"
    assert m.reasons()[-2] == "standby"
    await eventually(lambda: bool(m.spawn.of("p~standby2")))  # the next one, for the next


async def test_a_stop_takes_the_standby_along(machine: Make) -> None:
    m = await with_standby(machine)
    await m.life().stop()
    assert m.spawn.of("p~standby1")[0].signals == [signal.SIGTERM]


async def test_a_failure_for_good_takes_the_standby_along(machine: Make) -> None:
    m = await with_standby(machine, NO)
    await exits(m, 1, State.FAILED)
    await m.settled()
    assert m.spawn.of("p~standby1")[0].signals == [signal.SIGTERM]


async def test_a_stop_for_a_restart_keeps_the_standby(machine: Make) -> None:
    m = await with_standby(machine)
    await m.life().stop(keep_standby=True)
    (spare,) = m.spawn.of("p~standby1")
    assert spare.returncode is None
    m.life().launch()
    await m.state(State.READY)
    assert m.life().child is spare


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (SpawnError("command not found: fake"), "command not found: fake"),
        (RuntimeError("no such interpreter"), "RuntimeError: no such interpreter"),
    ],
)
async def test_a_standby_that_cannot_be_spawned_is_reported(
    machine: Make, error: Exception, said: str
) -> None:
    """A standby's spawn errors are said, whatever they are (one not a ``SpawnError`` was
    swallowed by a discard's ``suppress(Exception)``), and the life goes on without one."""
    m = machine(standby_spec())
    m.spawn.fail["p~standby1"] = error
    await ready(m)
    await eventually(lambda: bool(m.notices("standby not spawned")))
    assert m.notices("standby not spawned") == [f"p: standby not spawned: {said}"]
    await exits(m, 1, State.BACKOFF)
    await m.clock.tick(1)
    await m.state(State.READY)
    assert len(m.spawn.of("p")) == 2 and m.spawn.of("p")[-1] is m.life().child


async def test_a_standby_that_exited_while_waiting_is_not_adopted(machine: Make) -> None:
    m = await with_standby(machine)
    m.spawn.of("p~standby1")[0].exit(1)
    await eventually(lambda: bool(m.notices("while it waited")))
    await exits(m, 1, State.BACKOFF)
    await m.clock.tick(1)
    await m.state(State.READY)
    assert len(m.spawn.of("p")) == 2


# ------------------------------------------------------------------ probes and health


async def test_a_clean_stop_never_shows_a_failing_probe(machine: Make) -> None:
    """A server stopped on request stops answering its health check while it shuts
    down: the probes stop as the stop begins, and health says nothing once it stops."""
    m = await ready(machine(spec(readiness=READINESS, liveness=LIVENESS)))
    await m.clock.asleep(LIVENESS.period)  # its first liveness check passed
    assert m.life().status().health == "ok"
    m.child().slow_stop = asyncio.Event()
    stop = asyncio.create_task(m.life().stop())
    await eventually(lambda: m.child().signals == [signal.SIGTERM])
    checked = len(m.prober.checks)
    m.prober.failing.add(LIVE_URL)  # it shuts down: its health check would fail now
    m.clock.advance(LIVENESS.period * 3)
    m.child().slow_stop.set()
    await stop
    assert len(m.prober.checks) == checked, "a probe ran during the stop"
    assert [e.ok for e in m.probes("liveness")] == [True]
    assert m.life().status().health is None


def progress(**fields: object) -> ProgressProbe:
    base: dict[str, object] = {
        "url": "http://fake/v1/completions",
        "body": {"prompt": [0], "max_tokens": 1},
        "metrics_url": "http://fake/metrics",
        "counters": ["requests_done_total"],
        "idle_after": 30,
        "period": 5,
        "failure_threshold": 2,
        "bearer_env": "TOKEN",
    }
    return ProgressProbe(**{**base, **fields})


async def test_the_progress_probe_asks_for_work_only_when_idle(machine: Make) -> None:
    env = {"TOKEN": "secret"}
    m = await ready(machine(spec(readiness=READINESS, progress=progress(), env=env)))
    for _ in range(12):  # a minute in which requests complete: nothing asked
        await m.clock.asleep(5)
        m.prober.count += 1
        m.clock.advance(5)
    for _ in range(6):  # then idle: asked once 30 s passed without one
        await m.clock.tick(5)
    await m.clock.asleep(5)
    assert m.prober.asked == ["secret"]
    assert [(e.ok, e.message) for e in m.probes("progress")] == [
        (True, "asked for work after 30 s idle, it answered HTTP 200")
    ]
    for _ in range(5):  # a passed request counts as work: not asked again before 30 s
        await m.clock.tick(5)
    await m.clock.asleep(5)
    assert m.prober.asked == ["secret"]
    assert m.life().status().health == "ok" and m.life().state is State.READY


async def test_a_process_that_answers_health_but_does_no_work_is_restarted(
    machine: Make,
) -> None:
    probes = {"readiness": READINESS, "liveness": LIVENESS, "progress": progress()}
    m = await ready(machine(spec(restart=ALWAYS, **probes)))
    m.prober.answer = (False, "it timed out after 1 s")
    for _ in range(7):  # liveness and progress both sleep their period
        await m.clock.tick(5, sleepers=2)
    await m.state(State.BACKOFF)
    saw = "no request completed for 35 s; asked for work, it timed out after 1 s"
    assert m.reasons()[-2] == f"progress probe failed: {saw}"
    assert m.path()[-3:] == [State.READY, State.UNHEALTHY, State.BACKOFF]
    assert m.restarting()[-1].reason == f"progress probe failed: {saw}"
    assert [e.ok for e in m.probes("liveness")] == [True], "its health check answered"
    assert [e.ok for e in m.probes("progress")] == [False, False]
    assert m.child().signals == [signal.SIGTERM]
    await m.clock.tick(1)
    await m.state(State.READY)
    assert len(m.spawn.of("p")) == 2


def test_the_docs_show_the_table_the_code_checks() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "supervisor.md").read_text()
    shown = docs.split("<!-- transitions:begin -->\n")[1].split("<!-- transitions:end -->")[0]
    assert shown == markdown_table(), "regenerate it: python -m grpo_tui.supervisor.transitions"


async def test_a_spec_replaced_while_it_runs_takes_its_health_probes_at_once(
    machine: Make,
) -> None:
    """A mode switched in place replaces the spec of a running server: a progress probe it
    turns off (an engine that will sleep by design) stops now, not at the next start."""
    m = await ready(machine(spec(readiness=READINESS, progress=progress())))
    await m.clock.asleep(5)
    m.life().replace_spec(spec(readiness=READINESS))
    await eventually(lambda: m.clock.sleeping == [])
    m.clock.advance(600)
    await asyncio.sleep(0)
    assert m.prober.asked == [] and m.life().state is State.READY
    m.life().replace_spec(spec(readiness=READINESS, progress=progress(idle_after=10)))
    await m.clock.asleep(5)
    await m.clock.tick(5)
    await m.clock.tick(5)
    await m.clock.asleep(5)
    assert m.prober.asked == [None]


async def test_a_progress_failure_shows_in_health_until_work_resumes(machine: Make) -> None:
    """One failed request for work (of the two that make it unhealthy): the status says
    which check fails and what it saw; requests completing again make it ok."""
    m = await ready(machine(spec(readiness=READINESS, progress=progress())))
    m.prober.answer = (False, "it timed out after 1 s")
    for _ in range(6):
        await m.clock.tick(5)
    await m.clock.asleep(5)
    saw = "no request completed for 30 s; asked for work, it timed out after 1 s"
    status = m.life().status()
    assert (status.state, status.health, status.failing) == (
        State.READY,
        "failing",
        {"progress": saw},
    )
    m.prober.count += 1
    await m.clock.tick(5)
    await m.clock.asleep(5)
    status = m.life().status()
    assert (status.state, status.health, status.failing) == (State.READY, "ok", {})
    assert [(e.ok, e.message) for e in m.probes("progress")] == [
        (False, saw),
        (True, "requests completed again"),
    ]


# ------------------------------------------------------------------ its own word on its health


async def test_a_process_reporting_itself_failing_shows_it_without_a_state_change(
    machine: Make,
) -> None:
    m = await ready(machine(spec(readiness=READINESS, liveness=LIVENESS)))
    await m.clock.asleep(LIVENESS.period)
    path = m.path()
    m.life().report_health(False, "the task fails: ValueError: boom")
    m.life().report_health(False, "the task fails: ValueError: boom")  # said once
    status = m.life().status()
    assert (status.state, status.health) == (State.READY, "failing")
    assert status.failing == {"self": "the task fails: ValueError: boom"}
    await m.clock.tick(LIVENESS.period)  # its liveness passes: still failing by its word
    assert m.life().status().health == "failing"
    m.life().report_health(True, "the task ran through again")
    assert (m.life().status().health, m.life().status().failing) == ("ok", {})
    assert [(e.ok, e.message) for e in m.probes("self")] == [
        (False, "the task fails: ValueError: boom"),
        (True, "the task ran through again"),
    ]
    assert m.path() == path, "a report changes no state"


async def test_a_failing_report_and_a_failing_probe_are_both_shown(machine: Make) -> None:
    liveness = HttpProbe(url=LIVE_URL, period=5, failure_threshold=2)
    m = await ready(machine(spec(readiness=READINESS, liveness=liveness)))
    await m.clock.asleep(5)  # its first liveness check passed
    m.life().report_health(False, "disk full")
    m.prober.failing.add(LIVE_URL)
    await m.clock.tick(5)
    await m.clock.asleep(5)  # one check failed: not yet unhealthy
    assert m.life().status().failing == {"self": "disk full", "liveness": f"{LIVE_URL} refused"}
    m.prober.failing.clear()
    await m.clock.tick(5)
    await m.clock.asleep(5)
    status = m.life().status()
    assert (status.state, status.health, status.failing) == (
        State.READY,
        "failing",
        {"self": "disk full"},
    )


async def test_a_report_counts_for_its_incarnation_only(machine: Make) -> None:
    """A report while it stops says nothing; a new incarnation starts with none."""
    m = await started(machine(spec(restart=ALWAYS)))
    m.life().report_health(False, "disk full")
    assert m.life().status().health == "failing"
    await exits(m, 1, State.BACKOFF)
    m.life().report_health(False, "late word from the one that exited")
    assert m.life().status().health is None
    await m.clock.tick(1)
    await m.state(State.RUNNING)
    assert (m.life().status().health, m.life().status().failing) == (None, {})
    m.child().slow_stop = asyncio.Event()
    stop = asyncio.create_task(m.life().stop())
    await m.state(State.STOPPING)
    m.life().report_health(False, "shutting down")
    m.child().slow_stop.set()
    await stop
    assert [e.message for e in m.probes("self")] == ["disk full"]
