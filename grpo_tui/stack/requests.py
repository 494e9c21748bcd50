"""The control-socket actions the GRPO stack adds to the supervisor's own (status, restart,
stop, start, kill): ``switch_mode`` (``args.mode``), ``edit`` (``args``: the values) and
``mode_switched`` (the trainer's answer to an in-place switch, ``args``: ``ModeSwitched``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_trainer.run_notices import ModeSwitched
from grpo_tui.supervisor.requests import ControlRequest, RequestHandler

if TYPE_CHECKING:
    from grpo_tui.stack.stack import GrpoStack


def stack_requests(stack: GrpoStack) -> dict[str, RequestHandler]:
    """``action -> handler`` for ``Supervisor.handle``."""

    async def edit(request: ControlRequest) -> dict[str, Any]:
        return stack.edit(request.args)

    async def switch_mode(request: ControlRequest) -> dict[str, Any]:
        mode = request.args.get("mode")
        if not isinstance(mode, str):
            raise ValueError("switch_mode needs args.mode, a mode name")
        await stack.switch_mode(mode)
        return {"mode": mode}

    async def mode_switched(request: ControlRequest) -> dict[str, Any]:
        stack.switch_answers.answer(ModeSwitched.model_validate(request.args))
        return {}

    return {"edit": edit, "switch_mode": switch_mode, "mode_switched": mode_switched}
