"""``grpo-tui serve``: a profile's inference server alone, kept for runs to attach to.

The serving profile keeps ``[run]`` (named ``<name>-serve``: its own run directory, no
``exit_with``: it lasts until stopped), ``[inference]`` and ``[process.inference]``; the
API, the trainer and the environments are left out, and ``model = "tiny"`` still builds
the tiny model first. The server is the one a run of the profile would start in its mode,
so it has every capability a run may switch to (``grpo_trainer/serve/capabilities.py``).

Its own progress probe is off: a run attached to it may put it to sleep for a step
(``colocate``) or pause it for a reload, and that run's own probe watches it. A profile
that attaches to a server itself (``inference.url``), a cluster profile, and a mode whose
syncs restart inference (which no run can attach in) are refused, naming the key.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.serve.settings import InferenceSettings
from grpo_tui.plan.profile import Problem, Profile, ProfileError
from grpo_tui.plan.roles import Plan, build_plan
from grpo_tui.plan.settings import ANY_ADDRESS

SERVED = "inference"
SHUTDOWN = 30.0
"""Seconds the kept server has to stop before it is killed (``[process.inference] shutdown``
changes it)."""


def serving_profile(profile: Profile) -> Profile:
    """``profile`` with its inference server alone; raises ``ProfileError`` naming what
    cannot be served."""
    problems: list[Problem] = []
    inference = profile.table("inference")
    if not isinstance(inference, dict):
        problems.append(profile.problem(("inference",), "serve keeps the [inference] server: none"))
        inference = {}
    if inference.get("url"):
        problems.append(
            profile.problem(
                ("inference", "url"),
                "this profile attaches to a server at url; serve starts one: remove the url",
            )
        )
    cluster = profile.table("cluster")
    if isinstance(cluster, dict) and cluster.get("engine") == "slurm":
        message = "serve keeps a server on this machine, not in a Slurm job"
        problems.append(profile.problem(("cluster", "engine"), message))
    mode = profile.run.mode
    if restarts_inference(mode, str(inference.get("none_reload", "in_place"))):
        problems.append(
            profile.problem(
                ("run", "mode"),
                f"mode {mode} restarts inference at every sync, so no run attaches in it: "
                "serve the profile in an in-place mode (--mode none, shared_vllm, lora_only "
                "or colocate)",
            )
        )
    if problems:
        raise ProfileError(problems)
    processes = profile.table("process")
    own = processes.get(SERVED, {}) if isinstance(processes, dict) else {}
    # Nothing waits for a kept server's stop (a run's inference gets 3 s: a restart does):
    # the built-in server closes its HTTP side cleanly when given the time.
    adjustment: dict[str, Any] = {
        "shutdown": {"timeout": SHUTDOWN},
        **(own if isinstance(own, dict) else {}),
        "progress": False,
    }
    data = {"run": profile.data.get("run", {}), SERVED: inference}
    data["process"] = {SERVED: adjustment}
    run = profile.run.model_copy(update={"name": f"{profile.run.name}-serve", "exit_with": None})
    return replace(profile, data=data, run=run)


def serve_plan(profile: Profile, run_dir: Path | None = None) -> Plan:
    """The checked plan of ``grpo-tui serve``; raises ``ProfileError``."""
    return build_plan(serving_profile(profile), run_dir=run_dir)


def attach_url(plan: Plan) -> str:
    """The URL runs attach to: the server's, by this host's name when it listens on every
    address."""
    served = plan.roles.inference or InferenceSettings()
    host = socket.gethostname() if served.host in (ANY_ADDRESS, "::") else served.host
    return f"http://{host}:{served.port}"
