"""Process specs for the dashboard tests: small real child scripts as a GRPO stack."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpo_tui.supervisor.spec import LogLineProbe, ProcessSpec, RestartPolicy

CHILDREN = str(Path(__file__).with_name("tui_children.py"))


def child(name: str, role: str, *argv: str, mode: str = "none", **extra: Any) -> ProcessSpec:
    return ProcessSpec(
        name=name,
        role=role,
        command=[sys.executable, CHILDREN, *argv],
        env={"STANDIN_MODE": mode, "PYTHONUNBUFFERED": "1"},
        **extra,
    )


def stack(mode: str = "none", *, crasher: bool = False) -> list[ProcessSpec]:
    specs = [
        child(
            "inference",
            "inference",
            "server",
            "inference",
            mode=mode,
            readiness=LogLineProbe(pattern="inference ready", period=0.05),
        ),
        child(
            "trainer",
            "trainer",
            "trainer",
            mode=mode,
            depends_on={"inference": {"condition": "process_healthy"}},
            readiness=LogLineProbe(pattern="grpo-trainer ready", period=0.05),
        ),
    ]
    if crasher:
        policy = RestartPolicy(policy="on_failure", backoff_base=0.05, max_restarts=3)
        specs.append(child("flaky", "env", "crasher", restart=policy))
    return specs


def respec_for(specs: list[ProcessSpec]) -> Callable[[str, Mapping[str, Any]], ProcessSpec]:
    """Rebuild a stand-in's spec in another mode (what the role layer does for real)."""
    by_name = {spec.name: spec for spec in specs}

    def respec(name: str, args: Mapping[str, Any]) -> ProcessSpec:
        spec = by_name[name]
        env = {**spec.env, "STANDIN_MODE": str(args.get("mode", spec.env["STANDIN_MODE"]))}
        return spec.model_copy(update={"env": env})

    return respec
