"""The GRPO stack over a real supervisor: in a mode switch without a plan inference restarts
in the new mode, the trainer checkpoints, stops and resumes, the rest keeps running; the
stack's control requests are registered once; inference's incarnations are written as its
state changes. (The in-place switch: tests/e2e/test_e2e_mode_switch.py.)"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest
from conftest import child, free_port, spec

from grpo_trainer.run_notices import InferenceLife, NoticeWatcher
from grpo_tui.plan.roles import SwitchPlan
from grpo_tui.stack import modes
from grpo_tui.stack.inference_life import InferenceLifeWriter
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.events import Notice, State, StateChanged
from grpo_tui.supervisor.spec import Shutdown, TcpProbe
from grpo_tui.supervisor.supervisor import Supervisor


async def test_switch_mode_restarts_inference_then_trainer_keeping_the_rest(supervise) -> None:
    port = free_port()
    calls: list[tuple[str, dict]] = []
    trainer_code = "import os, time\nprint('ready', os.environ['MODE'], flush=True)\ntime.sleep(60)"

    def build(name: str, mode: str) -> object:
        if name == "inference":
            return spec(
                "inference",
                child("listener.py", "--port", port),
                role="inference",
                env={"MODE": mode},
                readiness=TcpProbe(port=port, period=0.05),
            )
        return spec(
            "trainer",
            [sys.executable, "-c", trainer_code],
            role="trainer",
            env={"MODE": mode},
            depends_on={"inference": {}},
            readiness={"kind": "log_line", "pattern": "^ready"},
        )

    def respec(name: str, args: dict) -> object:
        calls.append((name, dict(args)))
        return build(name, args["mode"])

    keeper = spec("env", [sys.executable, "-c", "import time; time.sleep(60)"])
    h = supervise(
        [build("inference", "none"), build("trainer", "none"), keeper],
        respec=respec,
        exit_with="trainer",
    )
    await h.state("trainer", State.READY)
    env_pid = h.sup.status()["env"].pid
    await GrpoStack(h.sup).switch_mode("lora_only")
    # the trainer's spec first (a mode the run cannot use is refused before any stop)
    assert calls == [("trainer", {"mode": "lora_only"}), ("inference", {"mode": "lora_only"})]
    assert h.sup.recent_lines("trainer")[-1] == "ready lora_only"
    assert h.sup.status()["env"].pid == env_pid
    assert not h.run_task.done(), "stopping the trainer for a switch must not end the run"
    stopped = next(e for e in h.changes("trainer") if e.new == State.STOPPED).t
    restarted = [e for e in h.changes("inference") if e.new == State.STARTING][-1].t
    assert restarted > stopped


async def test_switch_into_a_mode_the_run_cannot_use_stops_nothing(supervise) -> None:
    sleeper = [sys.executable, "-c", "import time\nprint('ready', flush=True)\ntime.sleep(60)"]
    ready = {"kind": "log_line", "pattern": "^ready"}

    def respec(name: str, args: dict) -> object:
        raise ValueError("inference.weight_transfer: is 'cuda_ipc', which needs ...")

    h = supervise(
        [
            spec("inference", sleeper, role="inference", readiness=ready),
            spec("trainer", sleeper, role="trainer", readiness=ready),
        ],
        respec=respec,
    )
    await h.state("trainer", State.READY)
    await h.state("inference", State.READY)
    before = {name: status.pid for name, status in h.sup.status().items()}
    with pytest.raises(ValueError, match="weight_transfer"):
        await GrpoStack(h.sup).switch_mode("shared_vllm")
    status = h.sup.status()
    assert {name: s.pid for name, s in status.items()} == before
    assert {s.state for s in status.values()} == {State.READY}


async def test_trainer_may_restart_inference_while_it_stops_for_a_switch(supervise) -> None:
    """In a restart mode the trainer's last step can ask for an inference restart after the
    SIGTERM of a mode switch: that request must not wait for the switch (which waits for
    the trainer), or the trainer is SIGKILLed at its shutdown timeout without a checkpoint."""
    port = free_port()

    def build(name: str, args: dict) -> object:
        if name == "inference":
            return spec(
                "inference",
                child("listener.py", "--port", port),
                role="inference",
                readiness=TcpProbe(port=port, period=0.05),
            )
        return spec(
            "trainer",
            child("asker.py", "inference"),
            role="trainer",
            depends_on={"inference": {"condition": "process_healthy"}},
            readiness={"kind": "log_line", "pattern": "asker ready"},
            shutdown=Shutdown(timeout=30),
        )

    h = supervise([build("inference", {}), build("trainer", {})], respec=build)
    await h.state("trainer", State.READY)
    async with asyncio.timeout(20):
        await GrpoStack(h.sup).switch_mode("lora_restart")
    replies = [x for x in h.sup.recent_lines("trainer") if x.startswith("reply ")]
    assert json.loads(replies[0].removeprefix("reply "))["ok"]
    assert h.sup.status()["trainer"].state == State.READY
    stopped = next(e for e in h.changes("trainer") if e.new == State.STOPPED)
    assert stopped.exit_code == 0


@pytest.mark.parametrize("route", ["in place, trainer killed", "trainer restart"])
@pytest.mark.parametrize(("mode", "inference_restarts"), [("lora_only", True), ("colocate", False)])
async def test_a_trainer_resumed_into_a_mode_while_inference_kept_serving_gets_its_base_served(
    supervise, monkeypatch: pytest.MonkeyPatch, route: str, mode: str, inference_restarts: bool
) -> None:
    """A trainer that resumes in the new mode from its newest checkpoint while inference
    keeps serving: an in-place switch whose trainer restarts before it answers (killed
    here: it never switched), or a switch that restarts the trainer alone (a multi-rank
    trainer). Into a LoRA mode the checkpoint is the adapter's base, which the running
    server does not hold (it holds the trainer's last sync): inference restarts onto it,
    its spec rebuilt after the trainer is back. Into a full mode the trainer's attach
    pushes its weights: inference keeps serving, its spec rebuilt for later starts."""
    monkeypatch.setattr(modes, "SAY_EVERY", 0.2)  # how often the wait checks the trainer
    port = free_port()
    calls: list[tuple[str, dict]] = []
    trainer_code = "import time\nprint('ready', flush=True)\ntime.sleep(60)"

    def build(name: str, args: dict) -> object:
        calls.append((name, dict(args)))
        if name == "inference":
            return spec(
                "inference",
                child("listener.py", "--port", port),
                role="inference",
                readiness=TcpProbe(port=port, period=0.05),
            )
        return spec(
            "trainer",
            [sys.executable, "-c", trainer_code, modes.TRAINER_MODULE],  # the notice's argv
            role="trainer",
            readiness={"kind": "log_line", "pattern": "^ready"},
            restart={"policy": "always", "backoff_base": 0.1},
        )

    h = supervise([build("inference", {}), build("trainer", {})], respec=build)
    await h.state("trainer", State.READY)
    await h.state("inference", State.READY)
    calls.clear()
    inference_pid = h.sup.status()["inference"].pid
    in_place = route.startswith("in place")
    plan = SwitchPlan(None, None if in_place else "a trainer of several ranks")
    stack = GrpoStack(h.sup, planner=lambda mode: plan)
    switching = asyncio.create_task(stack.switch_mode(mode))
    if in_place:
        switch = f"switching to mode {mode} in place"
        await h.until(lambda e: isinstance(e, Notice) and switch in e.message)
        await h.sup.signal("trainer", signal.SIGKILL)
    async with asyncio.timeout(20):
        await switching
    assert calls[-1] == ("inference", {"mode": mode}), calls
    assert (h.sup.status()["inference"].pid != inference_pid) == inference_restarts
    assert h.sup.status()["inference"].state == State.READY


def test_a_request_action_has_one_handler(tmp_path) -> None:
    sup = Supervisor([spec("a", [sys.executable, "-c", "pass"])], tmp_path / "run")
    GrpoStack(sup)
    with pytest.raises(ValueError, match="action 'edit' already has a handler"):
        GrpoStack(sup)


def test_inference_incarnations_follow_its_state_changes(tmp_path) -> None:
    """Ready: that incarnation (the supervisor's number), up; leaving ready: down at once
    (the API holds the environments from then on); changes that move nothing are not
    written."""
    sup = Supervisor([spec("inference", [sys.executable, "-c", "pass"], role="inference")],
                     tmp_path / "run")  # fmt: skip
    (tmp_path / "run").mkdir()
    writer = InferenceLifeWriter(sup)
    watcher = NoticeWatcher(writer.path, InferenceLife)

    def change(old: State, new: State, pid: int | None, readied: int) -> InferenceLife | None:
        event = StateChanged(process="inference", old=old, new=new, pid=pid, incarnation=readied)
        writer.apply(event)
        return watcher.current()

    assert change(State.PENDING, State.STARTING, 10, 0) is None
    assert change(State.STARTING, State.READY, 10, 1) == InferenceLife(
        incarnation=1, up=True, pid=10, t=writer.life.t
    )
    assert change(State.READY, State.BACKOFF, 10, 1).up is False
    assert change(State.BACKOFF, State.STARTING, 11, 1).incarnation == 1
    back = change(State.STARTING, State.READY, 11, 2)
    assert (back.incarnation, back.up, back.pid) == (2, True, 11)
