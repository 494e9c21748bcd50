"""The control-socket actions the GRPO stack adds to the supervisor's own (status, restart,
stop, start, kill): ``switch_mode`` (``args.mode``), ``edit`` (``args``: the values) and
``mode_switched`` (the trainer's answer to an in-place switch, ``args``: ``ModeSwitched``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from grpo_trainer.run_notices import ModeSwitched
from grpo_tui.stack.modes import SwitchAnswers
from grpo_tui.supervisor.requests import ControlRequest, RequestHandler


def stack_requests(
    apply_edit: Callable[[Mapping[str, Any]], dict[str, Any]],
    switch_to: Callable[[str], Awaitable[None]],
    answers: SwitchAnswers,
) -> dict[str, RequestHandler]:
    """``action -> handler`` for ``Supervisor.handle``, over the stack's edit, its mode
    switch and the trainer's answers to in-place switches (``GrpoStack``)."""

    async def edit(request: ControlRequest) -> dict[str, Any]:
        return apply_edit(request.args)

    async def switch_mode(request: ControlRequest) -> dict[str, Any]:
        mode = request.args.get("mode")
        if not isinstance(mode, str):
            raise ValueError("switch_mode needs args.mode, a mode name")
        await switch_to(mode)
        return {"mode": mode}

    async def mode_switched(request: ControlRequest) -> dict[str, Any]:
        answers.answer(ModeSwitched.model_validate(request.args))
        return {}

    return {"edit": edit, "switch_mode": switch_mode, "mode_switched": mode_switched}
