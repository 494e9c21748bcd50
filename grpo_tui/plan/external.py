"""A run attached to a server it does not own (``[inference] url``): what the plan checks.

Offline (every ``check``, ``--profile-only`` too): the modes that restart inference at each
sync need a server we own. At preflight (``check``, ``run``; nothing started yet): the
server is asked what it serves and has (``grpo_trainer.serve.external``) and refused, with
the reason, when it does not answer, serves another model (name or shape), lacks what the
mode needs (LoRA, reload in place, sleep mode, shared weights, the lease), or another run
holds its lease. Every problem names ``inference.url``.
"""

from __future__ import annotations

from typing import Any

from grpo_trainer.serve.capabilities import restarts_inference
from grpo_trainer.serve.external import Needs, Unreachable, describe, missing, shape_of
from grpo_trainer.serve.settings import inference_headers
from grpo_trainer.train.memory_fit import read_model_config
from grpo_tui.plan.profile import Problem
from grpo_tui.plan.settings import RoleSettings
from grpo_tui.plan.toml_keys import KeyPath

URL_KEY: KeyPath = ("inference", "url")


def restart_problems(settings: RoleSettings, mode: str) -> list[Problem]:
    """A mode whose syncs restart inference cannot run on a server we do not own."""
    inference = settings.inference
    if inference is None or not inference.external:
        return []
    if not restarts_inference(mode, inference.none_reload):
        return []
    why = (
        "lora_restart serves each adapter by restarting inference: use lora_only, which "
        "loads it into the running server"
        if mode == "lora_restart"
        else 'none_reload = "restart" restarts inference at each sync: use "in_place"'
    )
    message = f"mode {mode} needs an inference server this run owns, not one at a url: {why}"
    return [settings.profile.problem(URL_KEY, message)]


def expected_shape(settings: RoleSettings) -> dict[str, Any] | None:
    """The shape of the model the run trains, where it is known without loading it: the
    tiny model's from ``[run.tiny]``, a model's from its ``config.json`` on disk."""
    run = settings.profile.run
    if run.tiny_model:
        tiny = run.tiny
        return {
            "model_type": "qwen2",
            "hidden_size": tiny.hidden_size,
            "intermediate_size": tiny.intermediate_size,
            "num_hidden_layers": tiny.num_layers,
            "num_attention_heads": tiny.num_heads,
            "num_key_value_heads": tiny.num_kv_heads,
        }
    return shape_of(read_model_config(settings.model_path))


def needs(settings: RoleSettings, mode: str, holder: str | None = None) -> Needs:
    """What a run of ``settings`` in ``mode`` expects of the server it attaches to."""
    inference = settings.inference
    assert inference is not None
    return Needs(
        mode=mode,
        backend=inference.backend,
        served_model_name=inference.served_model_name,
        shape=expected_shape(settings),
        model=None if settings.profile.run.tiny_model else settings.model_path,
        weight_transfer=inference.weight_transfer,
        holder=holder,
    )


def probe_problems(settings: RoleSettings, mode: str) -> list[Problem]:
    """Ask the server at ``inference.url``; a problem for each thing the run would lack."""
    inference = settings.inference
    if inference is None or inference.url is None:
        return []
    url = inference.url
    try:
        facts = describe(url, headers=inference_headers())
    except Unreachable as error:
        message = f"no inference server answers at {url} ({error}); start one with `grpo-tui serve`"
        return [settings.profile.problem(URL_KEY, message)]
    return [
        settings.profile.problem(URL_KEY, f"the server at {url}: {reason}")
        for reason in missing(facts, needs(settings, mode))
    ]
