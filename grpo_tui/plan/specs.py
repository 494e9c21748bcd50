"""Spec builders: each role's process spec from its settings, topology and overrides.

Roles run in the order api -> inference -> trainer -> env(s), each with a readiness probe,
a restart policy and a shutdown timeout that suit it. With ``model = "tiny"`` a one-shot
``model`` process builds the tiny model into ``RUN/model`` first. A
``[process.<role process>]`` table then adjusts the built spec (:func:`adjusted`).
Torch-free: ``grpo-tui check`` prints these specs.
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

from grpo_trainer.api.settings import TOKEN_ENV
from grpo_trainer.serve.attach import ATTACHED
from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.settings import InferenceSettings, request_model_name
from grpo_tui.plan.launchers import Launch
from grpo_tui.plan.overrides import Overrides, served_on_start
from grpo_tui.plan.settings import RoleSettings, env_index, require, trainer_config
from grpo_tui.plan.toml_keys import KeyPath
from grpo_tui.plan.topology import Topology
from grpo_tui.supervisor.spec import (
    Condition,
    Dependency,
    External,
    HttpProbe,
    LogLineProbe,
    Need,
    ProcessSpec,
    ProgressProbe,
    RestartPolicy,
    Shutdown,
)

TRAINER_READY = r"grpo-trainer ready"
ENV_READY = r"grpo-env registered"
INFERENCE_KEY_ENV = "VLLM_API_KEY"
"""The inference server's bearer token: vLLM's own variable, read by the built-in server
and by our clients too, so one name serves both backends."""
TRANSFER_ADDRESS_ENV = "GRPO_WEIGHT_TRANSFER_ADDRESS"
"""Read by ``grpo_trainer.sync.vllm_shared`` (not imported here: it needs torch)."""

TRAINER_SHUTDOWN = 120.0
"""Seconds a stopping trainer (every rank) has to finish its step and checkpoint."""
# vLLM 0.24 never ends its HTTP shutdown while requests are in flight (it aborts the engine,
# then waits for the open connections with no timeout), so every restart-mode sync waited
# out the whole grace before the SIGKILL: 30 of the 65 s of each restart on an H200
# (2026-11-24), then 8 of ~22 s in half of a lora_restart run's restarts (2026-11-26: its
# engine core was gone 0.1 s after the SIGTERM, uvicorn "waiting for connections to close"
# the rest). Inference holds nothing to save, so its grace is short.
INFERENCE_SHUTDOWN = 3.0

GENERATED = (
    "vllm:request_success_total",
    "vllm:generation_tokens_total",
    "sglang:generation_tokens_total",
)
"""Counters whose growth says inference generates: requests completed, tokens generated
(vLLM's names, which the built-in server uses too, and SGLang's)."""
GENERATION_IDLE = 60.0
"""Seconds without a completed request or a generated token before inference is asked for
one token; the ask waits 30 s, twice in a row before a restart: a paused engine (a weight
sync, a reload in place) answers well within that, a stuck scheduler never does."""

ATTACH_MODULE = "grpo_trainer.serve.attach"
EXTERNAL_PATIENCE = 180
"""Attach attempts in a row before a run gives up on an external server that went away:
with attempts every 5 s at most (``backoff_cap``) and the attach command's own 10 s wait
for ``/health``, about as long as the trainer waits for inference (``DOWN_WAIT``, 900 s)."""
DETACH_TIMEOUT = 300.0
"""Seconds the detach command (the base reloaded in place) may take at the run's end."""

HEALTHY = Dependency(condition=Condition.HEALTHY)
STARTED = Dependency(condition=Condition.STARTED)
BUILT = Dependency(condition=Condition.COMPLETED)

Builder = Callable[[RoleSettings, Topology, Overrides], ProcessSpec]


def model_spec(settings: RoleSettings, topology: Topology, overrides: Overrides) -> ProcessSpec:
    """The one-shot build of the tiny model into ``RUN/model``."""
    build = [sys.executable, "-m", "grpo_trainer.tiny_model", "build", settings.model_path]
    return ProcessSpec(
        name="model",
        role="model",
        command=[*build, "--seed", str(settings.seed), *settings.profile.run.tiny.flags()],
        shutdown=Shutdown(timeout=10),
    )


def api_spec(settings: RoleSettings, topology: Topology, overrides: Overrides) -> ProcessSpec:
    """The rollout API: always restarted, healthy when ``/health`` answers; its ``/metrics``
    (queue depth, time in queue, the served version) scraped by the supervisor."""
    api = require(settings.api)
    argv = api.model_copy(update={"token": None}).argv(run_dir=settings.run_dir)
    launch, step = topology.step("api", Launch(argv=argv))
    health = f"{settings.api_url}/health"
    return ProcessSpec(
        name="api",
        role="api",
        command=launch.argv,
        slurm_step=step,
        env=token_env(settings),
        port=api.port,
        metrics_url=f"{settings.api_url}/metrics",
        readiness=HttpProbe(url=health, period=0.2, timeout=2.0),
        liveness=HttpProbe(url=health, initial_delay=5, period=10, timeout=5, failure_threshold=3),
        restart=RestartPolicy(policy="always", backoff_base=0.5, max_restarts=5),
        shutdown=Shutdown(timeout=15),
    )


def inference_spec(settings: RoleSettings, topology: Topology, overrides: Overrides) -> ProcessSpec:
    """The inference server in the overrides' mode, serving what ``served_on_start`` says;
    or, with ``[inference] url``, the server the run attaches to (:func:`external_spec`)."""
    served = require(settings.inference)
    if served.url is not None:
        return external_spec(settings, overrides)
    weights = served_on_start(settings, overrides)
    command = inference_command(
        served,
        mode=overrides.mode,
        model=weights.model or settings.model_path,
        adapter=weights.adapter,
        shared_dir=str(settings.run_dir / "shared_weights"),
    )
    health = f"{settings.inference_url}/health"
    launch, step = topology.launch(
        "inference", Launch(argv=command.argv, env=command.env), shutdown_timeout=INFERENCE_SHUTDOWN
    )
    return ProcessSpec(
        name="inference",
        role="inference",
        command=launch.argv,
        slurm_step=step,
        env={**launch.env, **token_env(settings)},
        port=served.port,
        metrics_url=f"{settings.inference_url}/metrics",
        depends_on=_model_deps(settings),
        prestart=command.gated and launch.argv == command.argv,
        standby=command.gated and launch.argv == command.argv and _standby(served, overrides),
        readiness=HttpProbe(url=health, period=0.25, timeout=2.0),
        liveness=HttpProbe(
            url=health, initial_delay=10, period=15, timeout=10, failure_threshold=4
        ),
        progress=generation_probe(settings, overrides.mode),
        restart=RestartPolicy(policy="always", backoff_base=1.0, max_restarts=5),
        shutdown=Shutdown(timeout=INFERENCE_SHUTDOWN),
    )


def lease_holder(settings: RoleSettings) -> tuple[str, str]:
    """The run's lease holder id on a kept server (its host and run directory: unique to
    the run) and how a refusal names it."""
    host = socket.gethostname()
    return f"{host}:{settings.run_dir}", f"run {settings.run_dir.name} on {host}"


def external_spec(settings: RoleSettings, overrides: Overrides) -> ProcessSpec:
    """A server the run attaches to by URL and never starts, stops or signals
    (``grpo_tui/supervisor/external.py``). Attaching (the spec's command, at each start
    and whenever the server is back after a loss) takes the run's lease and, at the run's
    first attach, resets the server to the run's base; detaching at the run's end leaves it
    serving the base and lets the lease go (``grpo_trainer/serve/attach.py``). Its
    liveness probe is quick (a lost server is seen within seconds); the restart policy's
    attempts are how long the run waits for it to come back."""
    served = require(settings.inference)
    url = served.base_url
    holder, label = lease_holder(settings)
    module = [sys.executable, "-m", ATTACH_MODULE]
    base = ["--holder", holder, "--base", settings.model_path]
    attach = [*module, "attach", url, *base, "--label", label, "--ttl", f"{served.lease_ttl:g}"]
    return ProcessSpec(
        name="inference",
        role="inference",
        command=attach,
        env=token_env(settings),
        metrics_url=f"{url}/metrics",
        external=External(url=url, detach=[*module, "detach", url, *base]),
        depends_on=_model_deps(settings),
        readiness=LogLineProbe(pattern=re.escape(ATTACHED), period=0.2),
        liveness=HttpProbe(url=f"{url}/health", period=1, timeout=2, failure_threshold=2),
        progress=generation_probe(settings, overrides.mode),
        restart=RestartPolicy(
            policy="always", backoff_base=1.0, backoff_cap=5.0, max_restarts=EXTERNAL_PATIENCE
        ),
        shutdown=Shutdown(timeout=DETACH_TIMEOUT),
    )


def generation_probe(settings: RoleSettings, mode: str) -> ProgressProbe | None:
    """Inference is healthy only if it generates: its ``/health`` still answers when its
    scheduler is stuck (peers report vLLM's missing a deadlocked one). Once nothing was
    generated for ``GENERATION_IDLE`` s, a one-token completion of the base model (of a
    server the run attaches to, whatever name it serves the base under: no ``model``,
    which vLLM, SGLang and the built-in server take as the base). None in ``colocate``,
    whose engine sleeps by design while the trainer steps."""
    if mode == "colocate":
        return None
    served = require(settings.inference)
    named = {} if served.external else {"model": served.base_model_name(mode)}
    return ProgressProbe(
        url=f"{settings.inference_url}/v1/completions",
        body={
            **named,
            "prompt": [0],
            "max_tokens": 1,
            "temperature": 0.0,
        },
        bearer_env=INFERENCE_KEY_ENV if settings.token is not None else None,
        metrics_url=f"{settings.inference_url}/metrics",
        counters=list(GENERATED),
        idle_after=GENERATION_IDLE,
        period=10,
        timeout=30,
        failure_threshold=2,
    )


def trainer_spec(settings: RoleSettings, topology: Topology, overrides: Overrides) -> ProcessSpec:
    """The trainer in the overrides' mode: one process, or torchrun over its ranks."""
    depends = _model_deps(settings)
    depends.update({r: HEALTHY for r in ("api", "inference") if r in settings.roles})
    config = trainer_config(settings, overrides.mode)
    if "inference" in depends and _loads_alongside(settings, config.device):
        depends["inference"] = STARTED  # it waits for /health itself (inference_timeout)
    argv = config.argv()
    launch, step = topology.launch(
        "trainer", Launch(argv=argv), shutdown_timeout=TRAINER_SHUTDOWN, ranks_per_gpu=True
    )
    return ProcessSpec(
        name="trainer",
        role="trainer",
        command=launch.argv,
        slurm_step=step,
        env={**launch.env, **token_env(settings), **_transfer_env(settings)},
        depends_on=depends,
        needs=_trainer_needs(settings),
        prestart=launch.argv == argv,  # one local process: it reads the start gate
        readiness=LogLineProbe(pattern=TRAINER_READY, period=0.2),
        restart=RestartPolicy(policy="on_failure", backoff_base=1.0, max_restarts=5),
        shutdown=Shutdown(timeout=TRAINER_SHUTDOWN),
    )


def env_spec(
    settings: RoleSettings, topology: Topology, overrides: Overrides, name: str = "env"
) -> ProcessSpec:
    """Env process ``name``, asking inference for the model the mode serves."""
    env = require(settings.envs[env_index(name)])
    if settings.inference is not None:  # the adapter's request name depends on the mode
        env = env.model_copy(
            update={
                "model_name": request_model_name(settings.inference, overrides.mode),
                "prompt_copies": settings.inference.backend == "sglang",
            }
        )
    depends = _model_deps(settings)
    depends.update({r: HEALTHY for r in ("api", "inference", "trainer") if r in settings.roles})
    command = env.command(
        api_url=settings.api_url,
        inference_url=settings.inference_url,
        tokenizer=settings.model_path,
    )
    launch, step = topology.step(name, Launch(argv=command))
    return ProcessSpec(
        name=name,
        role="env",
        command=launch.argv,
        slurm_step=step,
        env=token_env(settings),
        depends_on=depends,
        prestart=launch.argv == command,  # every task runs grpo_trainer.envs.cli.main
        readiness=LogLineProbe(pattern=ENV_READY, period=0.2),
        restart=RestartPolicy(policy="on_failure", backoff_base=1.0, max_restarts=5),
        shutdown=Shutdown(timeout=10),
    )


BUILDERS: dict[str, Builder] = {
    "model": model_spec,
    "api": api_spec,
    "inference": inference_spec,
    "trainer": trainer_spec,
}


def role_spec(
    name: str, settings: RoleSettings, topology: Topology, overrides: Overrides
) -> ProcessSpec:
    """The spec of role process ``name``; raises ``ValueError`` or pydantic's
    ``ValidationError`` for settings the overrides made invalid."""
    if name in BUILDERS:
        return BUILDERS[name](settings, topology, overrides)
    return env_spec(settings, topology, overrides, name)


PROBES = ("readiness", "liveness", "progress")


def adjusted(spec: ProcessSpec, adjustment: Mapping[str, Any] | None) -> ProcessSpec:
    """``spec`` with its ``[process.<name>]`` table applied (env and depends_on merge; a
    probe set to ``false`` is turned off)."""
    if not adjustment:
        return spec
    merged = spec.model_dump()
    for key, value in adjustment.items():
        if key in ("env", "depends_on") and isinstance(value, dict):
            merged[key] = {**merged[key], **value}
        elif key in PROBES and value is False:
            merged[key] = None
        else:
            merged[key] = value
    return ProcessSpec.model_validate(merged)


def source(name: str, adjustment: Mapping[str, Any] | None) -> KeyPath:
    """Where role process ``name``'s spec comes from in the profile (for its problems)."""
    if set(adjustment or ()) & {"depends_on", "port"}:
        return ("process", name)
    if name == "model":
        return ("run", "model")
    if name.startswith("env"):
        return ("env", env_index(name))
    return (name,)


def _standby(served: InferenceSettings, overrides: Overrides) -> bool:
    """Keep a gated next incarnation of inference ready: vLLM in every mode (a crash
    restart would wait 20-30 s of imports; a standby holds host memory, no GPU memory),
    the built-in server where the mode restarts it at each sync."""
    return served.backend == "vllm" or restarts_inference(overrides.mode, served.none_reload)


def _loads_alongside(settings: RoleSettings, trainer_device: str) -> bool:
    """The trainer may load its model while inference starts: off the GPU, on GPUs
    inference does not use, or beside an engine that does not size its KV cache from the
    memory free while it starts (vLLM with ``--kv-cache-memory-bytes``, the built-in
    server). On a cluster it waits for inference's health, as before."""
    served = settings.inference
    if served is None or settings.cluster.slurm or served.external:
        return False  # (an external server is attached, and reset, before it is ready)
    if not trainer_device.startswith("cuda") or not served.sizes_kv_from_free_memory:
        return True
    pinned = set(settings.trainer_gpus), set(served.gpus or ())
    return all(pinned) and not pinned[0] & pinned[1]


def _trainer_needs(settings: RoleSettings) -> list[Need]:
    """What the trainer cannot go on without: the API, inference, one of the environments."""
    needs = [Need(any_of=[role]) for role in ("api", "inference") if role in settings.roles]
    envs = [name for name in settings.roles if name.startswith("env")]
    return [*needs, Need(any_of=envs)] if envs else needs


def _model_deps(settings: RoleSettings) -> dict[str, Dependency]:
    return {"model": BUILT} if "model" in settings.roles else {}


def _transfer_env(settings: RoleSettings) -> dict[str, str]:
    """On a cluster: the trainer node's address, where vLLM joins the NCCL weight group."""
    if not settings.cluster.slurm:
        return {}
    return {TRANSFER_ADDRESS_ENV: settings.address("trainer")}


def token_env(settings: RoleSettings) -> dict[str, str]:
    """The API token (and on a cluster the inference server's, the same run token) as
    environment variables: kept out of ``ps`` and of the plan."""
    env = {}
    if settings.api is not None and settings.api.token is not None:
        env[TOKEN_ENV] = settings.api.token.get_secret_value()
    if settings.token is not None:
        env[INFERENCE_KEY_ENV] = settings.token
    return env
