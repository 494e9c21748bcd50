"""Control-socket requests: one handler per action, registered on the supervisor.

The supervisor answers the generic ones itself (``status``, and ``restart``, ``stop``,
``start``, ``kill`` of a target process, named or by its role); whatever runs over it adds
its own with ``Supervisor.handle(action, handler)``. A handler's return value is the
reply's ``result``; an exception is the reply's ``error``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from grpo_tui.supervisor.record import ProcessStatus


@dataclass(frozen=True)
class ControlRequest:
    """One request: who asked, for what, on which process or role, with which args."""

    requester: str
    action: str
    target: str | None
    args: dict[str, Any]


RequestHandler = Callable[[ControlRequest], Awaitable[dict[str, Any]]]


class RequestHandlers:
    """``action -> handler``; ``dispatch`` is the control server's ``on_request``."""

    def __init__(self) -> None:
        self._handlers: dict[str, RequestHandler] = {}

    def add(self, action: str, handler: RequestHandler) -> None:
        if action in self._handlers:
            raise ValueError(f"action {action!r} already has a handler")
        self._handlers[action] = handler

    async def dispatch(
        self, requester: str, action: str, target: str | None, args: dict[str, Any]
    ) -> dict[str, Any]:
        handler = self._handlers.get(action)
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            raise ValueError(f"unknown action {action!r} (known: {known})")
        return await handler(ControlRequest(requester, action, target, args))


class Operations(Protocol):
    """What the supervisor's own requests act on (``Supervisor``)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    def by_role(self, role: str) -> str: ...

    def status(self) -> dict[str, ProcessStatus]: ...

    async def restart(self, name: str, *, args: Mapping[str, Any] | None = None) -> None: ...

    async def stop(self, name: str) -> None: ...

    async def start(self, name: str) -> None: ...

    async def kill(self, name: str) -> None: ...


def process_operations(sup: Operations) -> dict[str, RequestHandler]:
    """The supervisor's own actions: ``status`` of all, operations on one process."""

    async def status(request: ControlRequest) -> dict[str, Any]:
        return {"processes": {name: str(s.state) for name, s in sup.status().items()}}

    def on_one(operate: Callable[[str, ControlRequest], Awaitable[None]]) -> RequestHandler:
        async def handle(request: ControlRequest) -> dict[str, Any]:
            if request.target is None:
                raise ValueError(f"{request.action} needs a target process")
            name = request.target if request.target in sup.names else sup.by_role(request.target)
            await operate(name, request)
            status = sup.status()[name]
            return {
                "process": name,
                "state": str(status.state),
                "pid": status.pid,
                "incarnation": status.incarnation,
            }

        return handle

    return {
        "status": status,
        "restart": on_one(lambda name, request: sup.restart(name, args=request.args or None)),
        "stop": on_one(lambda name, _: sup.stop(name)),
        "start": on_one(lambda name, _: sup.start(name)),
        "kill": on_one(lambda name, _: sup.kill(name)),
    }
