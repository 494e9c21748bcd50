"""An inference server that is not ours, attached by URL (issue 37): what it serves and has.

A run with ``[inference] url`` (or ``--inference-url``) starts no server: it attaches to one
already running (vLLM, SGLang or our built-in server; ``grpo-tui serve`` keeps one between
runs). Over HTTP only (torch-free: ``grpo-tui check`` probes through here):

- :func:`describe`: what it serves and has (:class:`ServerFacts`), from ``/v1/models``,
  ``/server_info`` (vLLM's dev-mode route with ``config_format=json``; the built-in server
  answers the same names), SGLang's ``/get_server_info`` and ``/grpo/lease``;
- :func:`missing`: what a run in a given mode needs that it lacks, each with its reason.

Attaching, the lease and the reset between runs are ``serve/attach.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.serve.command_lines import SGLANG_REFUSED, VLLM_WORKER_EXTENSION
from grpo_trainer.serve.lease import LEASE_PATH
from grpo_trainer.serve.settings import LORA_MODES

SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
"""What makes two models the same shape (their weights may differ); ``serve/lora.py``'s."""
RELOAD_METHOD = "grpo_reload_weights"
"""The reload in place of full weights (the built-in server's and our worker extension's)."""
PROBE_TIMEOUT = 5.0


class Unreachable(RuntimeError):
    """Nothing answers at the URL (or not as an inference server)."""


@dataclass(frozen=True)
class ServerFacts:
    """What a running server serves and has, as far as it tells."""

    url: str
    backend: str
    """``builtin``, ``vllm``, ``sglang``, or ``unknown``."""
    base_names: tuple[str, ...]
    adapters: tuple[str, ...]
    root: str | None
    """The model it loaded (path or hub id), where it says."""
    shape: Mapping[str, Any] | None
    """``SHAPE_KEYS`` of its model's config; None when it does not say."""
    lease: Mapping[str, Any] | None
    """``GET /grpo/lease``; None when the server keeps no lease."""
    reload: bool = False
    """It reloads full weights in place: the built-in server, vLLM with our worker
    extension (``grpo_reload_weights``), SGLang (``/update_weights_from_disk``)."""
    worker_extension: bool = False
    lora: bool = False
    """It loads adapters at runtime."""
    sleep: bool = False
    shared_weights: str | None = None
    """Built-in: ``file`` or ``cuda_ipc`` (``--shared-weights``); None otherwise."""
    weight_transfer: str | None = None
    """vLLM's ``weight_transfer_config`` backend (``nccl``), if any."""
    notes: tuple[str, ...] = field(default=())
    """What could not be read (said by ``check``, not refused)."""


@dataclass(frozen=True)
class Needs:
    """What a run expects of the server it attaches to."""

    mode: str
    backend: str
    served_model_name: str
    shape: Mapping[str, Any] | None
    """The profile's model's shape (``SHAPE_KEYS``), where it can be known offline."""
    model: str | None
    """A hub id or path the server's ``root`` must name (None: the tiny model, built per run)."""
    weight_transfer: str
    holder: str | None = None
    """The run asking: a lease it holds already is no conflict."""


def get(http: httpx.Client, path: str, **params: Any) -> httpx.Response | None:
    """``GET path``; None for 404/405 (a route it does not have). Raises ``Unreachable``."""
    try:
        answer = http.get(path, params=params or None)
    except httpx.HTTPError as error:
        raise Unreachable(f"{type(error).__name__}: {error}") from None
    if answer.status_code in (404, 405):
        return None
    return answer


def json_of(answer: httpx.Response | None) -> dict[str, Any]:
    if answer is None or answer.status_code >= 400:
        return {}
    try:
        found = answer.json()
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _config_dict(value: Any) -> dict[str, Any] | None:
    """A Hugging Face config as vLLM's ``/server_info`` dumps it: a dict, or its repr
    (``Qwen2Config {json}``) where pydantic fell back to ``str``."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and "{" in value:
        try:
            found = json.loads(value[value.index("{") :])
        except ValueError:
            return None
        return found if isinstance(found, dict) else None
    return None


def shape_of(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``SHAPE_KEYS`` of a model config (its text model's for a multimodal one)."""
    if not config:
        return None
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        config = text
    return {key: config.get(key) for key in SHAPE_KEYS if config.get(key) is not None}


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes")


def describe(url: str, *, headers: Mapping[str, str] | None = None) -> ServerFacts:
    """Ask the server at ``url`` what it serves and has; ``Unreachable`` when nothing
    answers there as an inference server."""
    url = url.rstrip("/")
    with httpx.Client(base_url=url, headers=dict(headers or {}), timeout=PROBE_TIMEOUT) as http:
        health = get(http, "/health")
        if health is None or health.status_code != 200:
            status = "no /health route" if health is None else f"/health answered {health}"
            raise Unreachable(status)
        models = json_of(get(http, "/v1/models")).get("data")
        if not isinstance(models, list):
            raise Unreachable("/v1/models lists no models: not an OpenAI-compatible server")
        cards = [m for m in models if isinstance(m, dict) and m.get("id")]
        bases = tuple(str(m["id"]) for m in cards if not m.get("parent"))
        adapters = tuple(str(m["id"]) for m in cards if m.get("parent"))
        owners = {str(m.get("owned_by", "")) for m in cards}
        info = json_of(get(http, "/server_info", config_format="json"))
        lease_answer = get(http, LEASE_PATH)
        lease = json_of(lease_answer) if lease_answer is not None else None
        root = next((str(m["root"]) for m in cards if not m.get("parent") and m.get("root")), None)
        if "grpo_server" in info:
            return _builtin_facts(url, info, bases, adapters, root, lease)
        if "vllm" in owners:
            return _vllm_facts(url, info, bases, adapters, root, lease)
        if "sglang" in owners:
            sglang = json_of(get(http, "/get_server_info"))
            return _sglang_facts(url, sglang, bases, adapters, root, lease)
        return ServerFacts(
            url, "unknown", bases, adapters, root, None, lease, notes=(f"owned by {owners}",)
        )


def _builtin_facts(
    url: str,
    info: Mapping[str, Any],
    bases: tuple[str, ...],
    adapters: tuple[str, ...],
    root: str | None,
    lease: Mapping[str, Any] | None,
) -> ServerFacts:
    config = info.get("vllm_config") or {}
    model = config.get("model_config") or {}
    ours = info["grpo_server"]
    return ServerFacts(
        url=url,
        backend="builtin",
        base_names=bases,
        adapters=adapters,
        root=model.get("model") or root,
        shape=shape_of(_config_dict(model.get("hf_config"))),
        lease=lease,
        reload=RELOAD_METHOD in (ours.get("rpc_methods") or ()),
        lora=config.get("lora_config") is not None,
        sleep=bool(model.get("enable_sleep_mode")),
        shared_weights=ours.get("shared_weights"),
    )


def _vllm_facts(
    url: str,
    info: Mapping[str, Any],
    bases: tuple[str, ...],
    adapters: tuple[str, ...],
    root: str | None,
    lease: Mapping[str, Any] | None,
) -> ServerFacts:
    """vLLM: its dev-mode ``/server_info`` says the rest (without dev mode, nothing more)."""
    if not info:
        note = "no /server_info (VLLM_SERVER_DEV_MODE is off)"
        return ServerFacts(url, "vllm", bases, adapters, root, None, lease, notes=(note,))
    config = info.get("vllm_config") or {}
    model = config.get("model_config") or {}
    parallel = config.get("parallel_config") or {}
    env = info.get("vllm_env") or {}
    transfer = config.get("weight_transfer_config") or {}
    extension = parallel.get("worker_extension_cls") == VLLM_WORKER_EXTENSION
    config_dict = _config_dict(model.get("hf_config")) or _config_dict(model.get("hf_text_config"))
    notes = () if config_dict else ("its model config is not in /server_info: shape not checked",)
    return ServerFacts(
        url=url,
        backend="vllm",
        base_names=bases,
        adapters=adapters,
        root=model.get("model") or root,
        shape=shape_of(config_dict),
        lease=lease,
        reload=extension,
        worker_extension=extension,
        lora=config.get("lora_config") is not None
        and _truthy(env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")),
        sleep=bool(model.get("enable_sleep_mode")),
        shared_weights=None,
        weight_transfer=transfer.get("backend") if isinstance(transfer, dict) else None,
        notes=notes,
    )


def _sglang_facts(
    url: str,
    info: Mapping[str, Any],
    bases: tuple[str, ...],
    adapters: tuple[str, ...],
    root: str | None,
    lease: Mapping[str, Any] | None,
) -> ServerFacts:
    return ServerFacts(
        url=url,
        backend="sglang",
        base_names=bases,
        adapters=adapters,
        root=info.get("model_path") or root,
        shape=None,
        lease=lease,
        reload=True,
        lora=bool(info.get("enable_lora")),
        notes=("SGLang does not say its model's shape: not checked",),
    )


def missing(facts: ServerFacts, needs: Needs) -> list[str]:
    """What a run of ``needs`` lacks at the server of ``facts``, each a sentence; empty
    when it can attach."""
    problems: list[str] = []
    mode, start = needs.mode, "start it with `grpo-tui serve PROFILE`"
    if facts.backend != needs.backend:
        problems.append(
            f"it is a {facts.backend} server, the profile says backend = {needs.backend!r}: "
            f"set [inference] backend = {facts.backend!r}"
            if facts.backend != "unknown"
            else "it is no inference server grpo-tui knows (built-in, vLLM, SGLang)"
        )
        return problems
    wanted = {needs.served_model_name, f"{needs.served_model_name}-base"}
    if not wanted & set(facts.base_names):
        problems.append(
            f"it serves {', '.join(facts.base_names) or 'no base model'}, not "
            f"{needs.served_model_name!r} (or {needs.served_model_name}-base): another model, "
            "or another served_model_name"
        )
    if (
        needs.model is not None
        and facts.root is not None
        and not _same_model(needs.model, facts.root)
    ):
        problems.append(f"it serves the model {facts.root!r}, the profile's is {needs.model!r}")
    if needs.shape and facts.shape:
        differ = {
            key: (facts.shape.get(key), value)
            for key, value in needs.shape.items()
            if key in facts.shape and facts.shape[key] != value
        }
        if differ:
            said = ", ".join(f"{k} {have} (profile: {want})" for k, (have, want) in differ.items())
            problems.append(f"its model has another shape: {said}")
    if restarts_inference(mode, "in_place"):
        problems.append(
            f"mode {mode} restarts inference at every sync: it needs a server we own; attach "
            "in lora_only (the same adapters, loaded at runtime)"
        )
    if facts.backend == "sglang" and mode in SGLANG_REFUSED:
        problems.append(f"mode {mode} on SGLang: {SGLANG_REFUSED[mode]}")
    if not facts.reload:
        how = (
            f"vLLM needs VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls {VLLM_WORKER_EXTENSION}"
            if facts.backend == "vllm"
            else "its backend has no reload"
        )
        problems.append(
            f"it cannot reload the base weights in place, which every attached run does at "
            f"its start and end ({how}; or {start})"
        )
    if mode in LORA_MODES and not facts.lora:
        how = (
            "vLLM: --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"
            if facts.backend == "vllm"
            else "--enable-lora"
        )
        problems.append(f"mode {mode} loads adapters at runtime: it has no LoRA ({how})")
    if mode == "colocate" and not facts.sleep:
        problems.append("mode colocate sleeps the server through each step: no sleep mode")
    if mode in ("shared_vllm", "colocate"):
        problems += _sharing(facts, needs)
    if facts.lease is None:
        problems.append(
            "it keeps no lease, so nothing would stop a second run from attaching "
            f"({start}; vLLM: --middleware grpo_trainer.serve.lease.LeaseMiddleware)"
        )
    elif facts.lease.get("holder") not in (None, needs.holder):
        problems.append(f"another run holds it: {held_by(facts.lease)}")
    return problems


def _sharing(facts: ServerFacts, needs: Needs) -> list[str]:
    """What ``shared_vllm`` / ``colocate`` need: the built-in server's shared weights, or
    vLLM's worker extension (and, over NCCL, its weight-transfer config)."""
    if facts.backend == "builtin":
        if facts.shared_weights is None:
            return [f"mode {needs.mode} shares the server's weights: no --shared-weights"]
        return []
    if facts.backend != "vllm":
        return []
    if not facts.worker_extension:
        return [f"mode {needs.mode} needs the worker extension {VLLM_WORKER_EXTENSION}"]
    nccl = needs.mode == "shared_vllm" and needs.weight_transfer == "nccl"
    if nccl and facts.weight_transfer != "nccl":
        return ["weight_transfer = 'nccl': the server has no NCCL weight-transfer config"]
    return []


def _same_model(wanted: str, served: str) -> bool:
    if wanted == served:
        return True
    left, right = Path(wanted), Path(served)
    return left.exists() and right.exists() and left.resolve() == right.resolve()


def held_by(lease: Mapping[str, Any]) -> str:
    who = lease.get("label") or lease.get("holder")
    holder = lease.get("holder")
    expires = float(lease.get("expires_in") or 0.0)
    return f"{who} (holder {holder}; its lease expires in {expires:.0f} s unless renewed)"
