"""The training-mode switch: the trainer checkpoints and exits, inference restarts in the
new mode, the trainer resumes from its checkpoint.

Environments and the API keep running, so the rollout queue is kept. The run's plan builds
both new specs (``Supervisor.rebuilt_spec``: ``respec(name, {"mode": mode})``).
"""

from __future__ import annotations

from grpo_tui.supervisor.supervisor import Supervisor

TRAINER = "trainer"
INFERENCE = "inference"


async def switch_mode(supervisor: Supervisor, mode: str) -> None:
    """Switch the run to ``mode``; returns once inference and the trainer are ready again.

    The trainer is stopped holding only its own lock, as dependents are in
    ``Supervisor.restart``: its last step may still ask for an inference restart, which
    must be answered, not wait for this switch. The trainer's new spec is built first, so
    that a mode the run cannot use (the plan raises) is refused before anything stops;
    inference's is built once the trainer has saved, to serve its newest checkpoint.
    Raises ``ShuttingDown`` once the run's shutdown has begun.
    """
    trainer = supervisor.by_role(TRAINER)
    inference = supervisor.by_role(INFERENCE)
    supervisor.refuse_if_closing(inference)
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
