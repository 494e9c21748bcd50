"""Live hyperparameter edits (``grpo_trainer.live_edits``): validated by the plan, kept in
the specs of the processes they reach, read by those processes at their next step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from grpo_tui.supervisor.spec import ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

Editor = Callable[[Mapping[str, Any]], tuple[dict[str, Any], dict[str, ProcessSpec]]]
"""The plan's live-edit callback: (values parsed, rebuilt specs of the processes they
reach); raises ``ValueError`` with the reason for a refused edit."""


def apply_edit(
    supervisor: Supervisor, editor: Editor | None, values: Mapping[str, Any]
) -> dict[str, Any]:
    """Apply an edit: the editor validates and records it; the processes it reaches keep it
    in their specs for any restart. Raises ``ValueError`` with the reason when refused."""
    if editor is None:
        raise ValueError("this run takes no live edits")
    parsed, specs = editor(values)
    specs = {name: spec for name, spec in specs.items() if name in supervisor.names}
    for spec in specs.values():
        supervisor.replace_spec(spec)
    text = ", ".join(f"{key}={value}" for key, value in parsed.items())
    supervisor.notice(f"live edit: {text} -> {', '.join(specs)} (from their next step)")
    return {"values": parsed, "processes": list(specs)}
