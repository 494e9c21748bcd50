"""The training-mode switch: in place where the run allows it, else by restarts.

In place (the plan says nothing must restart): inference keeps serving (it was started
with every capability the switch needs, ``grpo_trainer/serve/capabilities.py``), the
trainer switches its weight sync in its own process at its next step boundary
(``grpo_trainer/train/switch.py``), asked through ``mode_switch.json`` and answering with a
``mode_switched`` control request. Both processes keep their pids; step count, API
registration and rollout queue are untouched.

Otherwise, as the plan says why: the trainer alone restarts (a multi-rank trainer; inference
keeps serving), or inference restarts in the new mode (``lora_restart``, a capability turned
off) and the trainer with it: the trainer checkpoints and exits, inference restarts, the
trainer resumes from its checkpoint. Environments and the API keep running in every case,
so the rollout queue is kept. The run's plan builds the new specs
(``Supervisor.rebuilt_spec``: ``respec(name, {"mode": mode})``), kept for later restarts.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from grpo_trainer.run_notices import MODE_SWITCH_FILE, ModeSwitch, ModeSwitched, write_notice
from grpo_trainer.serve.settings import LORA_MODES
from grpo_tui.plan.roles import SwitchPlan
from grpo_tui.supervisor.events import Notice
from grpo_tui.supervisor.supervisor import ProcessFailed, Supervisor

TRAINER = "trainer"
INFERENCE = "inference"
TRAINER_MODULE = "grpo_trainer.train"
SAY_EVERY = 15.0
MODE_ACTIVE = "mode_active"
"""``Notice.code`` once a switch is done (``data``: the ``mode``, ``in_place`` and, in place,
the trainer's ``step``)."""


SwitchPlanner = Callable[[str], SwitchPlan]
"""The plan's answer for a mode (``Plan.mode_switch``); raises ``ValueError`` for a mode
the run cannot use."""
RESTART_ALL = SwitchPlan(inference="no plan to ask", trainer="no plan to ask")


class SwitchAnswers:
    """The trainer's ``mode_switched`` answers, by the serial of the switch asked."""

    def __init__(self) -> None:
        self._serials = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[ModeSwitched]] = {}

    def ask(self) -> int:
        serial = next(self._serials)
        self._waiting[serial] = asyncio.get_running_loop().create_future()
        return serial

    def answer(self, answer: ModeSwitched) -> None:
        """Called by the control-socket handler; an answer nobody waits for is ignored."""
        future = self._waiting.pop(answer.serial, None)
        if future is not None and not future.done():
            future.set_result(answer)

    def future(self, serial: int) -> asyncio.Future[ModeSwitched]:
        return self._waiting[serial]


async def switch_mode(
    supervisor: Supervisor,
    mode: str,
    *,
    planner: SwitchPlanner | None = None,
    answers: SwitchAnswers | None = None,
) -> None:
    """Switch the run to ``mode``; returns once it is active (both processes ready).

    Raises ``ValueError`` for a mode the run cannot use (nothing stopped then),
    ``ShuttingDown`` once the run's shutdown has begun, ``ProcessFailed`` when the trainer
    could not switch in place.
    """
    inference = supervisor.by_role(INFERENCE)
    supervisor.refuse_if_closing(inference)
    plan = RESTART_ALL if planner is None or answers is None else planner(mode)
    if plan.inference is None and plan.trainer is None and answers is not None:
        await _in_place(supervisor, mode, answers)
    elif plan.inference is None:
        supervisor.notice(f"switching to mode {mode}: inference keeps serving; {plan.trainer}")
        await _restart_trainer(supervisor, mode)
    else:
        supervisor.notice(f"switching to mode {mode} restarts inference: {plan.inference}")
        await _restart_both(supervisor, mode)


async def _in_place(supervisor: Supervisor, mode: str, answers: SwitchAnswers) -> None:
    """Both keep running: the trainer is asked, and once it has switched, inference's spec
    is rebuilt for later starts (``_serve_what_the_trainer_trains``)."""
    trainer = supervisor.by_role(TRAINER)
    trainer_spec = supervisor.rebuilt_spec(trainer, {"mode": mode})
    supervisor.replace_spec(trainer_spec)
    command = trainer_spec.command
    serial = answers.ask()
    argv = command[command.index(TRAINER_MODULE) + 1 :]
    write_notice(
        supervisor.run_dir / MODE_SWITCH_FILE, ModeSwitch(serial=serial, mode=mode, argv=argv)
    )
    supervisor.notice(
        f"switching to mode {mode} in place: inference keeps serving, {trainer} switches "
        "at its next step boundary"
    )
    answer = await _answer(supervisor, trainer, answers.future(serial))
    await _serve_what_the_trainer_trains(
        supervisor, mode, switched=bool(answer and not answer.error)
    )
    if answer is None:
        message = f"mode {mode} active ({trainer} restarted into it)"
        data = {"mode": mode, "in_place": False}
        supervisor.publish(Notice(level="info", message=message, code=MODE_ACTIVE, data=data))
        return
    if answer.error is not None:
        raise ProcessFailed(
            f"{trainer} could not switch to {mode} in place ({answer.error}); it restarts "
            "in the new mode from its checkpoint"
        )
    message = (
        f"mode {mode} active: switched in place after step {answer.step} in "
        f"{answer.seconds:.2f} s (inference and {trainer} kept running)"
    )
    data = {"mode": mode, "in_place": True, "step": answer.step}
    supervisor.publish(Notice(level="info", message=message, code=MODE_ACTIVE, data=data))


async def _serve_what_the_trainer_trains(
    supervisor: Supervisor, mode: str, *, switched: bool
) -> None:
    """After a switch that kept inference running: its spec for its later starts (a restart
    by key, a crash restart), built now that the trainer has written its checkpoint. Into a
    LoRA mode the adapter's base is the full weights at the switch (``step_N``), which the
    rule of ``docs/inference.md`` ("What inference serves") finds on disk; a spec built when
    the switch was asked named the checkpoint before it (issue 35).

    A trainer that did not switch in place (it restarted into the mode: asked to, it
    failed, or was restarted meanwhile) resumes into a LoRA mode on the newest checkpoint,
    while the running server holds the weights of its last sync: inference restarts onto
    that base too."""
    inference = supervisor.by_role(INFERENCE)
    if switched or mode not in LORA_MODES:
        supervisor.replace_spec(supervisor.rebuilt_spec(inference, {"mode": mode}))
        return
    trainer = supervisor.by_role(TRAINER)
    await supervisor.wait_ready(trainer)
    supervisor.notice(
        f"{trainer} resumed into {mode} from its checkpoint: restarting {inference} onto "
        "the base its adapter sits on (the server holds the weights of its last sync)"
    )
    await supervisor.restart(inference, args={"mode": mode})


async def _answer(
    supervisor: Supervisor, trainer: str, answer: asyncio.Future[ModeSwitched]
) -> ModeSwitched | None:
    """The trainer's answer; None when the trainer restarted meanwhile (its new process
    starts in the new mode). Says every ``SAY_EVERY`` s what it waits for."""
    pid = supervisor.status()[trainer].pid
    since = time.monotonic()
    while True:
        try:
            async with asyncio.timeout(SAY_EVERY):
                return await asyncio.shield(answer)
        except TimeoutError:
            pass
        if supervisor.status()[trainer].pid != pid:
            await supervisor.wait_ready(trainer)
            return None
        supervisor.notice(
            f"waiting for {trainer} to reach its step boundary "
            f"({time.monotonic() - since:.0f} s; a step runs to its end first)"
        )


async def _restart_trainer(supervisor: Supervisor, mode: str) -> None:
    """The trainer checkpoints, stops and resumes in ``mode``; inference keeps serving, but
    for a trainer resumed into a LoRA mode (``_serve_what_the_trainer_trains``)."""
    trainer = supervisor.by_role(TRAINER)
    trainer_spec = supervisor.rebuilt_spec(trainer, {"mode": mode})
    supervisor.notice(f"stopping {trainer} (it checkpoints first)")
    await supervisor.stop(trainer)
    async with supervisor.holding(trainer) as held:
        await held.stop(trainer)
        supervisor.replace_spec(trainer_spec)
        await held.start(trainer)
    await supervisor.wait_ready(trainer)
    await _serve_what_the_trainer_trains(supervisor, mode, switched=False)
    supervisor.notice(f"mode {mode} active ({trainer} resumed from its checkpoint)")


async def _restart_both(supervisor: Supervisor, mode: str) -> None:
    """The trainer is stopped holding only its own lock, as dependents are in
    ``Supervisor.restart``: its last step may still ask for an inference restart, which
    must be answered, not wait for this switch. The trainer's new spec is built first, so
    that a mode the run cannot use (the plan raises) is refused before anything stops;
    inference's is built once the trainer has saved, to serve its newest checkpoint.
    """
    trainer = supervisor.by_role(TRAINER)
    inference = supervisor.by_role(INFERENCE)
    trainer_spec = supervisor.rebuilt_spec(trainer, {"mode": mode})
    note = supervisor.notice
    note(f"switching to mode {mode}: stopping {trainer} (it checkpoints first)")
    await supervisor.stop(trainer)
    async with supervisor.holding(inference, trainer) as held:
        await held.stop(trainer)
        note(f"stopping {inference}")
        await held.stop(inference)
        supervisor.replace_spec(supervisor.rebuilt_spec(inference, {"mode": mode}))
        supervisor.replace_spec(trainer_spec)
        note(f"starting {inference} in mode {mode}")
        await held.start(inference)
    await supervisor.wait_ready(inference)
    note(f"starting {trainer} (resuming from its checkpoint)")
    await supervisor.start(trainer)
    await supervisor.wait_ready(trainer)
    note(f"mode {mode} active")
