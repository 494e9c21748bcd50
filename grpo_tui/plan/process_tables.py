"""The profile's ``[process.<name>]`` tables and the graph of every process: each table made
a ``ProcessSpec``, dependencies and ``needs`` that name a process, one process per port, and
the start order (a dependency cycle is a problem naming it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from grpo_tui.plan.profile import Problem, Profile
from grpo_tui.plan.toml_keys import KeyPath, format_key
from grpo_tui.supervisor.spec import ProcessSpec


def validate_process_tables(
    profile: Profile, roles: Iterable[str]
) -> tuple[list[ProcessSpec], dict[str, KeyPath], list[Problem]]:
    """Validate every ``[process.<name>]`` table into a ``ProcessSpec`` (name from the key).

    Tables named after a role process (``[process.trainer]``) adjust that role's spec and
    are left to the role layer. Returns the specs, each one's key path in the profile, and
    the problems found.
    """
    specs: list[ProcessSpec] = []
    sources: dict[str, KeyPath] = {}
    problems: list[Problem] = []
    skip = set(roles)
    for name, table in (profile.table("process") or {}).items():
        where: KeyPath = ("process", name)
        if name in skip:
            continue
        if not isinstance(table, dict):
            problems.append(profile.problem(where, "must be a table"))
            continue
        if "name" in table:
            problems.append(profile.problem((*where, "name"), "the name comes from the key"))
            continue
        try:
            spec = ProcessSpec.model_validate({"name": name, **expand_depends_on(table)})
        except ValidationError as error:
            problems += profile.validation_problems(error, where, ProcessSpec)
            continue
        specs.append(spec)
        sources[name] = where
    return specs, sources, problems


def expand_depends_on(table: Mapping[str, Any]) -> dict[str, Any]:
    """Accept ``depends_on = ["a"]`` and ``depends_on = {a = "process_started"}``.

    Both read naturally in TOML; the spec wants ``{a = {condition = "..."}}``. A list means
    ``process_healthy`` for each name.
    """
    out = dict(table)
    depends = out.get("depends_on")
    if isinstance(depends, list) and all(isinstance(name, str) for name in depends):
        out["depends_on"] = {name: {} for name in depends}
    elif isinstance(depends, dict):
        out["depends_on"] = {
            name: {"condition": dep} if isinstance(dep, str) else dep
            for name, dep in depends.items()
        }
    return out


def check_graph(
    profile: Profile,
    specs: Sequence[ProcessSpec],
    sources: Mapping[str, KeyPath],
    names: Sequence[str],
) -> tuple[list[ProcessSpec], list[Problem]]:
    """Check dependencies and ports; return the specs in start order and the problems.

    Problems: a ``depends_on`` or ``needs`` naming no process, a dependency cycle, two
    processes configured on one port. ``names`` are all processes the profile defines
    (valid or not), so that one bad table does not make its dependents' references look
    wrong. The order is a topological order that keeps the profile's order among processes
    free to start together.
    """
    problems: list[Problem] = []
    known = ", ".join(names)
    for spec in specs:
        for dep in spec.depends_on:
            if dep not in names:
                problems.append(
                    profile.problem(
                        (*sources[spec.name], "depends_on", dep),
                        f"names no process (processes: {known})",
                    )
                )
        for index, need in enumerate(spec.needs):
            for name in need.any_of:
                if name not in names:
                    problems.append(
                        profile.problem(
                            (*sources[spec.name], "needs", index, "any_of"),
                            f"{name!r} names no process (processes: {known})",
                        )
                    )
    owners: dict[int, str] = {}
    for spec in specs:
        if spec.port is None:
            continue
        if spec.port in owners:
            other = owners[spec.port]
            problems.append(
                profile.problem(
                    (*sources[spec.name], "port"),
                    f"port {spec.port} is also used by {other} ({format_key(sources[other])})",
                )
            )
        else:
            owners[spec.port] = spec.name
    order, cycle = _topological(specs)
    if cycle:
        first, second = cycle[0], cycle[1]
        problems.append(
            profile.problem(
                (*sources[first], "depends_on", second),
                f"dependency cycle: {' -> '.join(cycle)}",
            )
        )
    return order, problems


def _topological(specs: Sequence[ProcessSpec]) -> tuple[list[ProcessSpec], list[str]]:
    """Kahn's order over known dependencies, and one cycle (as a closed path) if any."""
    names = {spec.name for spec in specs}
    waiting = {spec.name: {d for d in spec.depends_on if d in names} for spec in specs}
    order: list[ProcessSpec] = []
    remaining = list(specs)
    while remaining:
        free = [spec for spec in remaining if not waiting[spec.name]]
        if not free:
            return order, _find_cycle(waiting)
        for spec in free:
            order.append(spec)
            remaining.remove(spec)
            for deps in waiting.values():
                deps.discard(spec.name)
    return order, []


def _find_cycle(waiting: Mapping[str, set[str]]) -> list[str]:
    """Follow dependencies among the stuck processes until a name repeats."""
    start = next(name for name, deps in waiting.items() if deps)
    path = [start]
    while True:
        nxt = sorted(waiting[path[-1]])[0]
        if nxt in path:
            return [*path[path.index(nxt) :], nxt]
        path.append(nxt)
