"""The stall watchdog names the cause (issue 27): from the processes' states first, then
from what the trainer is doing and what the environments report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time

from conftest import child, spec

from grpo_tui.stack.progress import Progress
from grpo_tui.stack.stall import (
    StallWatch,
    backpressure_causes,
    error_causes,
    failing_cause,
    hold_causes,
    process_causes,
    progress_causes,
    restart_causes,
)
from grpo_tui.stack.stuck import Look, Quiet, quiet_env_causes, stopped_causes
from grpo_tui.supervisor.events import MetricsRecord, Stalled, State
from grpo_tui.supervisor.record import ProcessStatus

SLEEPER = [sys.executable, "-c", "import time\nprint('up', flush=True)\ntime.sleep(600)"]


def status(
    name: str,
    role: str,
    state: State,
    health: str | None = "ok",
    why: str = "",
    nth: int = 1,
    failing: dict[str, str] | None = None,
):
    if failing is None:
        failing = {"liveness": "HTTP 503"} if health == "failing" else {}
    return ProcessStatus(
        name, role, state, 1, 0.0, 0, None, health, None, why, nth, failing=failing
    )


def test_processes_name_servers_first_then_environments_then_the_trainer() -> None:
    statuses = {
        "api": status("api", "api", State.READY),
        "inference": status("inference", "inference", State.BACKOFF, why="killed by SIGKILL"),
        "trainer": status("trainer", "trainer", State.READY),
        "env-0": status("env-0", "env", State.FAILED, why="exited with code 2"),
        "env-1": status("env-1", "env", State.READY, health="failing"),
    }
    assert process_causes(statuses, "trainer") == [
        "inference is restarting (backoff: killed by SIGKILL)",
        "env-0 is down (failed: exited with code 2)",
        "env-1 is alive but not answering (its liveness probe fails: HTTP 503)",
    ]
    statuses["inference"] = status("inference", "inference", State.READY)
    statuses["env-0"] = status("env-0", "env", State.READY)
    statuses["env-1"] = status("env-1", "env", State.READY)
    assert process_causes(statuses, "trainer") == []


def test_a_failing_check_is_named_for_what_it_is() -> None:
    """Which check fails says what is wrong: inference's progress (generation) probe is a
    server that answers and generates nothing, not one "not answering"; an environment
    whose task keeps raising says so itself. Was: "its liveness probe fails" for each."""
    saw = "no request completed for 75 s; asked for work, it timed out after 30 s"
    statuses = {
        "inference": status("inference", "inference", State.READY, "failing", failing={
            "progress": saw}),
        "trainer": status("trainer", "trainer", State.READY),
        "env": status("env", "env", State.READY, "failing", failing={
            "self": "the task fails: ValueError: boom (in sample())"}),
    }  # fmt: skip
    assert process_causes(statuses, "trainer") == [
        f"inference answers but does no work (its progress probe fails: {saw})",
        "env reports itself failing: the task fails: ValueError: boom (in sample())",
    ]
    both = {"liveness": "timed out after 5 s", "progress": saw, "self": "disk full"}
    assert failing_cause(both) == (  # a server not answering does no work: one cause
        "is alive but not answering (its liveness probe fails: timed out after 5 s); "
        "reports itself failing: disk full"
    )


def test_processes_that_restarted_since_the_last_step_are_named() -> None:
    def up(name: str, role: str, started: float):
        return ProcessStatus(name, role, State.READY, 1, started, 1, None, "ok", None, "", 1)

    seen = Progress(step=7, step_at=100.0, phase="training")
    statuses = {
        "inference": up("inference", "inference", 90.0),  # up since before the step
        "env": up("env", "env", 104.0),
        "trainer": up("trainer", "trainer", 106.0),
    }
    assert restart_causes(statuses, "trainer", seen, now=110.0) == [
        "env restarted 6 s ago, since the trainer's last step",
        "the trainer restarted 4 s ago and is training its first step",
    ]


def test_the_rollout_apis_hold_is_named_with_the_incarnations() -> None:
    """Round 3's hang (a trainer that never pushed to the incarnation up) was reported as
    "the trainer restarted and is generating its first step" for five minutes: the API's
    hold, which kept every environment waiting, is a cause of its own."""
    statuses = {"inference": status("inference", "inference", State.READY, nth=3)}
    held = {"queue_sequences": 0, "inference_held": True, "served_incarnation": 2}
    assert hold_causes(statuses, held) == [
        "the rollout API holds the environments: inference incarnation 3 is up and the "
        "trainer has not pushed its weights to it (it last pushed to incarnation 2; it "
        "re-attaches by itself after a restart)"
    ]
    statuses["inference"] = status("inference", "inference", State.BACKOFF, nth=3)
    assert hold_causes(statuses, held) == [
        "the rollout API holds the environments until inference is up again and the trainer "
        "pushed its weights to it (it last pushed to incarnation 2)"
    ]
    assert hold_causes(statuses, {**held, "inference_held": False}) == []
    assert hold_causes(statuses, None) == [], "an API that did not answer says nothing here"


def test_environments_paused_by_back_pressure_are_named_while_the_trainer_waits() -> None:
    """Combos seed 34: a batch leased to a trainer SIGKILLed kept the environments paused
    (``max_batches_offpolicy = 0``) and the report said for 300 s only that the restarted
    trainer "is generating its first step". The pause is named; a trainer on a step holds
    its leased batch by design, so then it is not."""
    paused = {
        "queue_sequences": 16,
        "leased_batches": 1,
        "max_batches_offpolicy": 0,
        "backpressure": True,
    }
    assert backpressure_causes(paused, Progress(step=4, phase="generating")) == [
        "the environments are paused by back-pressure: the rollout API's queue is at "
        "max_batches_offpolicy 0 with 16 sequences queued and 1 batches leased and not "
        "acknowledged, and no step is training"
    ]
    assert backpressure_causes(paused, Progress(step=4, phase="training")) == []
    assert backpressure_causes({**paused, "backpressure": False}, Progress(step=4)) == []
    assert backpressure_causes(None, Progress(step=4)) == [], "an API that did not answer"


def test_environments_counting_errors_are_named_with_their_last_warning() -> None:
    def env(name: str, t: float, errors: float) -> MetricsRecord:
        return MetricsRecord(t=t, process=name, step=None, data={"env/errors": errors})

    seen = Progress()
    for record in (
        env("env-0", 1, 2),
        env("env-1", 1, 0),
        MetricsRecord(t=2, process="trainer", step=4, data={"loss": 0.1}),
        env("env-0", 9, 40),
        env("env-1", 9, 0),
    ):
        seen.fold(record, "trainer", {"env-0", "env-1"})
    said = "WARNING bad_completion: inference refused (404): The model `policy` does not exist."
    lines = {"env-0": [said, "INFO metrics step=4"], "env-1": []}

    def last(name: str) -> str | None:
        return next((line for line in reversed(lines[name]) if "WARNING" in line), None)

    assert error_causes(seen, last) == [
        f"env-0 counted 38 errors since the trainer's last step; its last: {said}"
    ]


def progress(*records: MetricsRecord) -> Progress:
    seen = Progress()
    for record in records:
        seen.fold(record, "trainer", {"env"})
    return seen


def test_what_the_trainer_does_and_the_environments_report() -> None:
    def env(t: float, sent: float, dropped: float) -> MetricsRecord:
        data = {"env/groups_sent": sent, "env/groups_dropped_equal_scores": dropped}
        return MetricsRecord(t=t, process="env", step=None, data=data)

    step = MetricsRecord(t=10, process="trainer", step=7, data={"loss": 0.1})
    syncing = MetricsRecord(t=11, process="trainer", step=7, data={"phase/current": 3.0})
    assert progress_causes(progress(step, syncing), 50, "0", "128") == [
        "a weight sync has not returned: syncing for 39 s"
    ]
    deterministic = progress(env(5, 40, 3), step, env(30, 40, 27))
    assert progress_causes(deterministic, 50, "0", "128") == [
        "the API holds 0 queued sequences of the 128 a step needs while the environments "
        "dropped 24 all-equal groups and sent none: every group scores the same (a policy "
        "that became deterministic?)"
    ]
    assert progress_causes(progress(env(5, 40, 3), step), 50, "0", "128") == [
        "the API holds 0 queued sequences of the 128 a step needs and the environments "
        "sent no group since the last step"
    ]
    restarted = progress(env(5, 40, 3), step, env(30, 2, 1))  # a new env process: from 0
    assert "sent 2 groups and dropped 1" in progress_causes(restarted, 50, "9", "128")[0]
    assert progress(syncing).step is None  # a phase change is not a step


async def test_a_stall_is_published_with_its_cause_once_past_the_first_step(supervise) -> None:
    """A trainer that reported two steps and went quiet while inference died: after
    ``after`` s a ``Stalled`` event (subscribers and events.jsonl) names inference."""
    trainer = spec("trainer", child("reporter.py"), role="trainer")
    inference = spec(
        "inference", SLEEPER, role="inference", readiness={"kind": "log_line", "pattern": "up"}
    )
    h = supervise([inference, trainer])
    watch = StallWatch(h.sup, after=1.0)
    watching = asyncio.create_task(watch.watch())
    try:
        await h.state("inference", State.READY)
        os.kill(h.sup.status()["inference"].pid, signal.SIGKILL)
        # (under load the first report may come before the kill: "no group since ...")
        stalled = await h.until(
            lambda e: isinstance(e, Stalled) and "inference" in e.causes[0], timeout=15
        )
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    assert stalled.process == "trainer" and stalled.step == 2 and stalled.seconds >= 1.0
    assert stalled.causes == ("inference is down (failed: killed by SIGKILL)",)
    await h.sup.shutdown("test finished")
    on_disk = [
        json.loads(line) for line in (h.sup.run_dir / "events.jsonl").read_text().splitlines()
    ]
    assert [r["causes"] for r in on_disk if r["type"] == "Stalled"][-1] == list(stalled.causes)


ENV_LINE = "env: sampling group 12"
QUIET_ENV = [sys.executable, "-c", f"import time\nprint({ENV_LINE!r}, flush=True)\ntime.sleep(600)"]
BUSY_ENV = [
    sys.executable,
    "-c",
    f"print({ENV_LINE!r}, flush=True)\nwhile True:\n    pass",
]


async def stalled_run(supervise, env_command: list[str]):
    """A trainer that reported two steps then went quiet, beside one environment."""
    trainer = spec("trainer", child("reporter.py"), role="trainer")
    env = spec("env", env_command, role="env", readiness={"kind": "log_line", "pattern": "env:"})
    h = supervise([trainer, env])
    watch = StallWatch(h.sup, after=1.0)
    return h, asyncio.create_task(watch.watch())


async def stop_watching(watching: asyncio.Task) -> None:
    watching.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching


async def test_a_stopped_environment_is_named_not_the_symptom(supervise) -> None:
    """Issue 35's new user: an env stopped with SIGSTOP for 70 s was reported as "the
    environments sent no group since the last step", with a guess that the policy became
    deterministic; the stopped process was never named. The report names it: pid, OS
    state, since when, CPU, its last line; and not the symptom in the trainer."""
    h, watching = await stalled_run(supervise, QUIET_ENV)
    try:
        await h.state("env", State.READY)
        pid = h.sup.status()["env"].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            stalled = await h.until(
                lambda e: isinstance(e, Stalled) and "is stopped" in " ".join(e.causes),
                timeout=20,
            )
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        await stop_watching(watching)
    cause = stalled.causes[0]
    assert cause.startswith(f"env (pid {pid}) is stopped (OS state stopped: SIGSTOP"), cause
    assert "quiet since " in cause and "% CPU" in cause and f"its last line: {ENV_LINE}" in cause
    assert not any("sent no group" in c or "deterministic" in c for c in stalled.causes)


async def test_an_environment_busy_in_a_loop_without_output_is_named(supervise) -> None:
    h, watching = await stalled_run(supervise, BUSY_ENV)
    try:
        await h.state("env", State.READY)
        pid = h.sup.status()["env"].pid
        stalled = await h.until(
            lambda e: isinstance(e, Stalled) and "busy" in " ".join(e.causes), timeout=20
        )
    finally:
        await stop_watching(watching)
    cause = stalled.causes[0]
    assert cause.startswith(f"env (pid {pid}) made no progress"), cause
    assert "busy in a loop without output" in cause and f"its last line: {ENV_LINE}" in cause
    assert not any("sent no group" in c for c in stalled.causes)


def test_a_process_with_a_stopped_child_names_the_child() -> None:
    statuses = {
        "inference": status("inference", "inference", State.READY, health="failing"),
        "env": status("env", "env", State.READY),
    }
    looks = {
        "inference": Look("sleeping", stopped=77, stopped_state="stopped"),
        "env": Look("sleeping"),
    }
    said = Quiet(since=100.0, cpu=0.0, line="INFO engine step")
    clock = time.strftime("%H:%M:%S", time.localtime(100.0))
    assert stopped_causes(statuses, looks, lambda name: said, now=170.0) == {
        "inference": "inference (pid 77, a child of pid 1) is stopped (OS state stopped: "
        f"SIGSTOP or a debugger; SIGCONT resumes it), quiet since {clock} (70 s), 0% CPU; "
        "its last line: INFO engine step"
    }


def test_a_quiet_environment_is_blocked_or_busy_as_its_os_state_says() -> None:
    statuses = {
        "env": status("env", "env", State.READY),
        "trainer": status("t", "trainer", State.READY),
    }
    seen = progress(
        MetricsRecord(t=50, process="env", step=None, data={"env/groups_sent": 4.0}),
        MetricsRecord(t=100, process="trainer", step=3, data={"loss": 0.1}),
    )
    clock = time.strftime("%H:%M:%S", time.localtime(100.0))

    def causes(state: str, cpu: float | None, now: float = 140.0) -> list[str]:
        quiet = Quiet(since=100.0, cpu=cpu, line=None)
        return quiet_env_causes(statuses, {"env": Look(state)}, lambda n: quiet, seen, now, 30)

    assert causes("sleeping", 0.0) == [
        "env (pid 1) made no progress (no group, no error, no output): OS state sleeping, "
        f"blocked: waiting on what does not answer, or deadlocked; quiet since {clock} (40 s), "
        "0% CPU"
    ]
    assert "OS state running, busy in a loop without output" in causes("running", 20.0)[0]
    assert "busy in a loop" in causes("sleeping", 95.0)[0], "the CPU use says so too"
    assert "CPU not sampled yet" in causes("sleeping", None)[0]
    assert causes("sleeping", 0.0, now=120.0) == [], "quiet for less than the bound"
    seen.fold(
        MetricsRecord(t=110, process="env", step=None, data={"env/errors": 1.0}), "trainer", {"env"}
    )
    assert causes("sleeping", 0.0) == [], "an error since the step is progress of a kind"


async def test_before_the_first_step_only_a_named_process_is_a_stall(supervise) -> None:
    """The new user's trainer said "no batch for 244 s ... (the supervisor's stall report
    names the cause)" before its first step, when no report could come: the clock started
    at the first step. Start-up stays no stall, unless a process holding up the first step
    can be named; then the clock runs from the trainer's readiness."""
    trainer = spec(
        "trainer", SLEEPER, role="trainer", readiness={"kind": "log_line", "pattern": "up"}
    )
    env = spec("env", QUIET_ENV, role="env", readiness={"kind": "log_line", "pattern": "env:"})
    h = supervise([trainer, env])
    watching = asyncio.create_task(StallWatch(h.sup, after=1.0).watch())
    try:
        await h.state("env", State.READY)
        pid = h.sup.status()["env"].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            stalled = await h.until(
                lambda e: isinstance(e, Stalled) and "is stopped" in " ".join(e.causes),
                timeout=20,
            )
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        await stop_watching(watching)
    assert stalled.step is None and stalled.causes[0].startswith(f"env (pid {pid}) is stopped")
    unnamed = [e for e in h.events if isinstance(e, Stalled) and not e.causes]
    assert unnamed == []
