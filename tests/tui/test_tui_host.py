"""The screens type against ``DashboardHost`` (``grpo_tui/screens/host.py``), not the app
that imports them: the app must have every member the protocol names, with the same
parameters, and be a coroutine where the protocol's is one. No type checker runs in CI, so
this is what keeps the protocol and the app from drifting apart."""

from __future__ import annotations

import inspect
from pathlib import Path

from grpo_tui.app import GrpoTuiApp
from grpo_tui.run_state import RunState
from grpo_tui.screens.host import DashboardHost


def protocol_members() -> tuple[set[str], dict[str, object]]:
    """The protocol's attributes and its methods (properties count as attributes)."""
    attributes = set(DashboardHost.__annotations__)
    methods = {}
    for name, value in vars(DashboardHost).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            attributes.add(name)
        elif inspect.isfunction(value):
            methods[name] = value
    return attributes, methods


def parameters(function: object) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]  # type: ignore[arg-type]


def test_the_app_has_every_member_its_screens_ask_for() -> None:
    app = GrpoTuiApp(RunState("a-run"), keymap_path=Path("/nonexistent/keymap.toml"))
    attributes, methods = protocol_members()
    assert {"state", "control", "read_only"} <= attributes and "action_quit" in methods
    assert [name for name in sorted(attributes) if not hasattr(app, name)] == []
    for name, declared in methods.items():
        actual = getattr(type(app), name, None)
        assert callable(actual), f"GrpoTuiApp has no method {name}"
        assert parameters(actual) == parameters(declared), name
        assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(declared), name
