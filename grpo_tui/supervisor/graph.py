"""The dependency graph of a set of process specs: checks, start order, dependents."""

from __future__ import annotations

from collections.abc import Sequence
from graphlib import CycleError, TopologicalSorter

from grpo_tui.supervisor.spec import ProcessSpec


class PlanError(ValueError):
    """The specs cannot be run together; the message lists every problem found."""


def start_order(specs: Sequence[ProcessSpec]) -> list[str]:
    """Names in an order where every process comes after its dependencies."""
    problems = []
    names = [spec.name for spec in specs]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"process name {name!r} is used twice")
    known = set(names)
    for spec in specs:
        for dep in spec.depends_on:
            if dep not in known:
                problems.append(f"{spec.name}.depends_on names no process: {dep!r}")
        for need in spec.needs:
            for name in need.any_of:
                if name not in known:
                    problems.append(f"{spec.name}.needs names no process: {name!r}")
    ports: dict[int, str] = {}
    for spec in specs:
        if spec.port is not None:
            if spec.port in ports:
                problems.append(f"{spec.name} and {ports[spec.port]} both use port {spec.port}")
            ports.setdefault(spec.port, spec.name)
    if problems:
        raise PlanError("; ".join(problems))
    sorter = TopologicalSorter({spec.name: list(spec.depends_on) for spec in specs})
    try:
        return list(sorter.static_order())
    except CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise PlanError(f"dependency cycle: {cycle}") from None


def dependents(specs: Sequence[ProcessSpec], name: str) -> list[str]:
    """Every process that depends on ``name``, directly or not, in start order."""
    found: set[str] = set()
    frontier = {name}
    while frontier:
        frontier = {s.name for s in specs if s.name not in found and frontier & set(s.depends_on)}
        found |= frontier
    return [n for n in start_order(specs) if n in found]
