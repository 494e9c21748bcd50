"""The plan: a profile's role tables and processes become checked specs for the supervisor.

The role layer is a pipeline of values: the profile's role settings
(``grpo_tui.plan.checks.read_settings``) -> their topology in a weight-sync mode
(``grpo_tui.plan.topology``) -> one spec per role process (``grpo_tui.plan.specs``),
with the run's overrides (``grpo_tui.plan.overrides``) applied throughout. A restart or
a mode switch (``Plan.respec``) and a live edit (``Plan.edit``) build a new
:class:`RoleLayer` from new overrides; the plan keeps it only if everything checks.
Torch-free: ``grpo-tui check`` goes through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from grpo_trainer.live_edits import record_edit
from grpo_trainer.serve.capabilities import switch_restarts_inference
from grpo_trainer.serve.settings import InferenceSettings
from grpo_tui.plan.checks import memory_fit, read_adjustments, read_settings
from grpo_tui.plan.cluster import Allocation, ClusterSettings, Placed
from grpo_tui.plan.external import restart_problems
from grpo_tui.plan.overrides import Overrides, edit_reasons, edited, in_force, respecified
from grpo_tui.plan.placement import GpuPlan
from grpo_tui.plan.process_tables import check_graph, validate_process_tables
from grpo_tui.plan.profile import Problem, Profile, ProfileError
from grpo_tui.plan.settings import RESTART_SYNC_EVERY, RoleSettings, with_keys
from grpo_tui.plan.specs import adjusted, role_spec, source
from grpo_tui.plan.toml_keys import KeyPath
from grpo_tui.plan.topology import Topology, cluster_problems, plan_topology
from grpo_tui.supervisor.control import ControlEndpoint
from grpo_tui.supervisor.spec import ProcessSpec

# RESTART_SYNC_EVERY (defined with the trainer's settings) is re-exported: the e2e tests
# read the product's cadence from the plan.
__all__ = ["RESTART_SYNC_EVERY", "Plan", "RoleLayer", "build_plan", "run_dir_for"]


def run_dir_for(profile: Profile, now: datetime | None = None) -> Path:
    """A new absolute ``<output_dir>/<name>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... if taken).

    Absolute so that every process finds it whatever its ``cwd``.
    """
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = (Path(profile.run.output_dir) / f"{profile.run.name}-{stamp}").resolve()
    run_dir, suffix = base, 1
    while run_dir.exists():
        suffix += 1
        run_dir = base.with_name(f"{base.name}-{suffix}")
    return run_dir


@dataclass(frozen=True)
class SwitchPlan:
    """What a switch to a mode restarts, each with the reason; None: it keeps running.

    The plan's answer (:meth:`Plan.mode_switch`); the stack's mode switch acts on it
    (``grpo_tui/stack/modes.py``)."""

    inference: str | None
    trainer: str | None


@dataclass(frozen=True)
class RoleLayer:
    """A plan's roles as they stand: the profile's settings, the overrides in force, and
    the settings and topology that follow from both."""

    profile_settings: RoleSettings
    adjustments: Mapping[str, Mapping[str, Any]]
    """``[process.<role process>]`` tables (``grpo_tui.plan.checks.read_adjustments``)."""
    overrides: Overrides
    settings: RoleSettings
    """The profile's settings with the overrides' keys applied."""
    topology: Topology

    @property
    def mode(self) -> str:
        return self.overrides.mode

    @property
    def roles(self) -> list[str]:
        """Role processes this profile defines, in start order."""
        return self.settings.roles

    @property
    def cluster(self) -> ClusterSettings:
        return self.settings.cluster

    @property
    def allocation(self) -> Allocation:
        return self.settings.allocation

    @property
    def control_endpoint(self) -> ControlEndpoint | None:
        return self.settings.control_endpoint

    @property
    def placements(self) -> Mapping[str, Placed]:
        return self.settings.placements

    @property
    def gpu_plan(self) -> GpuPlan:
        return self.topology.gpu_plan

    @property
    def inference(self) -> InferenceSettings | None:
        return self.settings.inference

    def spec(self, name: str) -> ProcessSpec:
        """The current spec of role process ``name`` (with the overrides in force)."""
        built = role_spec(name, self.settings, self.topology, self.overrides)
        return adjusted(built, self.adjustments.get(name))

    def specs(self) -> tuple[list[ProcessSpec], dict[str, KeyPath]]:
        """Every role process's spec and its key path in the profile; raises ProfileError."""
        profile = self.settings.profile
        specs: list[ProcessSpec] = []
        sources: dict[str, KeyPath] = {}
        problems: list[Problem] = []
        for name in self.roles:
            where = source(name, self.adjustments.get(name))
            try:
                built = role_spec(name, self.settings, self.topology, self.overrides)
            except (ValueError, ValidationError) as error:
                problems.append(profile.problem(where, str(error)))
                continue
            try:
                specs.append(adjusted(built, self.adjustments.get(name)))
            except ValidationError as error:
                problems += profile.validation_problems(error, ("process", name), ProcessSpec)
                continue
            sources[name] = where
        if problems:
            raise ProfileError(problems)
        return specs, sources

    def with_overrides(self, overrides: Overrides) -> RoleLayer:
        """This layer under other overrides; raises ``ValueError`` (or pydantic's
        ``ValidationError``) when a setting or the topology they lead to does not check."""
        settings = with_keys(self.profile_settings, overrides.keys, overrides.mode)
        topology = plan_topology(settings, overrides.mode)
        if topology.gpu_plan.problems:
            raise ValueError("; ".join(str(p) for p in topology.gpu_plan.problems))
        return replace(self, overrides=overrides, settings=settings, topology=topology)

    def respec(self, name: str, args: Mapping[str, Any]) -> tuple[RoleLayer, ProcessSpec]:
        """The layer with a restart's ``args`` for role process ``name`` kept, and the
        process's spec in it (``grpo_tui.plan.overrides.respecified`` says which args)."""
        layer = self.with_overrides(respecified(self.settings, self.overrides, name, args))
        return layer, layer.spec(name)

    def edit(
        self, values: Mapping[str, Any]
    ) -> tuple[RoleLayer, dict[str, Any], dict[str, ProcessSpec]]:
        """The layer with a live edit kept, the values as the settings parsed them, and the
        rebuilt specs of the processes they reach. The values in force are written to the
        run directory (``grpo_trainer.live_edits``). Raises ``ValueError`` naming the key
        and the reason."""
        overrides, names = edited(self.settings, self.overrides, values)
        run_dir = self.settings.run_dir
        try:
            layer = self.with_overrides(overrides)
            parsed = {key: in_force(layer.settings, layer.mode, key) for key in values}
            specs = {name: layer.spec(name) for name in names}
            record_edit(run_dir, parsed)
        except ValidationError as error:
            raise ValueError(edit_reasons(error)) from None
        except OSError as error:
            raise ValueError(f"cannot record the edit in {run_dir}: {error}") from None
        return layer, parsed, specs


@dataclass
class Plan:
    """Everything a run needs: specs in start order, the exit process, the role layer.

    ``respec`` and ``edit`` are the supervisor's callbacks: each replaces ``roles`` (or a
    generic process's spec) only when the request checks, so a refused one changes nothing.
    """

    profile: Profile
    run_dir: Path
    specs: list[ProcessSpec]
    exit_with: str | None
    roles: RoleLayer

    def respec(self, name: str, args: Mapping[str, Any]) -> ProcessSpec:
        """The supervisor's ``respec`` callback: roles rebuild, other processes update."""
        if name in self.roles.roles:
            self.roles, spec = self.roles.respec(name, args)
            return spec
        current = next((s for s in self.specs if s.name == name), None)
        if current is None:
            raise ValueError(f"no process named {name!r}")
        if not args:
            return current
        spec = ProcessSpec.model_validate({**current.model_dump(), **args})
        self.specs = [spec if s.name == name else s for s in self.specs]
        return spec

    def mode_switch(self, mode: str) -> SwitchPlan:
        """What a switch of this run to ``mode`` restarts, each with the reason: inference
        where its engine needs it (``capabilities.switch_restarts_inference``), the trainer
        unless it is one local process (which switches in place). Raises ``ValueError`` for
        a mode the run cannot use (one that restarts a server it attaches to)."""
        roles = self.roles
        if roles.inference is None:
            return SwitchPlan(inference="this run has no inference role", trainer=None)
        if refused := restart_problems(roles.settings, mode):
            raise ValueError(refused[0].message)
        trainer = None
        if roles.settings.trainer_ranks > 1 or roles.cluster.slurm:
            trainer = "a trainer of several ranks or on a cluster restarts into a new mode"
        # A server the run attaches to keeps what it has: a switch never restarts it (a
        # mode it cannot serve fails the trainer's switch, which says why).
        inference = None
        if not roles.inference.external:
            inference = switch_restarts_inference(roles.inference, roles.mode, mode)
        return SwitchPlan(inference=inference, trainer=trainer)

    def edit(self, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, ProcessSpec]]:
        """The supervisor's ``edit`` callback: a live edit validated, kept and written
        (:meth:`RoleLayer.edit`); returns the values and the rebuilt specs it reaches."""
        self.roles, parsed, specs = self.roles.edit(values)
        return parsed, specs


def build_plan(
    profile: Profile, run_dir: Path | None = None, allocation: Allocation | None = None
) -> Plan:
    """Expand roles and processes into a checked plan; raises ProfileError with every problem.

    ``allocation`` gives a cluster profile its real nodes (inside a Slurm job); without it
    the plan names them ``node1`` ...
    """
    run_dir = run_dir or run_dir_for(profile)
    mode = profile.run.mode
    settings = read_settings(profile, run_dir, allocation)
    topology = plan_topology(settings, mode)
    problems = [*settings.problems, *topology.gpu_plan.problems]
    if not problems:
        problems += memory_fit(settings, mode)
        problems += restart_problems(settings, mode)
    adjustments, found = read_adjustments(profile, settings.roles)
    problems += found
    if settings.cluster.slurm and not problems:
        problems += cluster_problems(settings, mode)
    roles = RoleLayer(settings, adjustments, Overrides(mode=mode), settings, topology)
    role_specs: list[ProcessSpec] = []
    sources: dict[str, KeyPath] = {}
    if not problems:
        try:
            role_specs, sources = roles.specs()
        except ProfileError as error:
            problems += error.problems
    extra, extra_sources, extra_problems = validate_process_tables(profile, roles.roles)
    problems += extra_problems
    sources.update(extra_sources)
    specs = [*role_specs, *extra]
    names = [*roles.roles, *(profile.table("process") or {})]
    order, graph_problems = check_graph(profile, specs, sources, names)
    problems += graph_problems
    exit_with = profile.run.exit_with
    if exit_with is None and "trainer" in roles.roles:
        exit_with = "trainer"
    if exit_with is not None and exit_with not in names:
        problems.append(
            profile.problem(
                ("run", "exit_with"), f"names no process (processes: {', '.join(names)})"
            )
        )
    if problems:
        raise ProfileError(problems)
    return Plan(profile=profile, run_dir=run_dir, specs=order, exit_with=exit_with, roles=roles)
