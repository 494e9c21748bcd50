"""Building the policy to train: from the base model or a resume point, full or LoRA.

Mode switches go through here: a LoRA run resuming from full weights puts a fresh adapter
on them; a full run resuming from an adapter merges it into its base at start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grpo_trainer.models import load_model
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.resume import ResumePoint, served_at_start


@dataclass
class Policy:
    """The model to train and the base an adapter (if any) sits on."""

    model: nn.Module
    base: str
    """The full model path/id under the trained weights (recorded in adapter checkpoints):
    in a LoRA mode what a starting inference server loads (``resume.served_at_start``)."""


def missing_lora_targets(model_name: str, targets: list[str]) -> list[str]:
    """Target module names that no linear layer of ``model_name`` carries.

    Builds the architecture on the meta device: no weights are read, so this runs before
    any model loads.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    names = {
        name.rsplit(".", 1)[-1] for name, m in skeleton.named_modules() if isinstance(m, nn.Linear)
    }
    return [t for t in targets if t != "all-linear" and t not in names]


def add_fresh_adapter(model: nn.Module, config: TrainerConfig, base: str) -> nn.Module:
    """Wrap ``model`` (the full weights at ``base``) in a new trainable LoRA adapter
    (initialised from ``config.seed``)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(config.seed)
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
        task_type="CAUSAL_LM",
    )
    return record_base(get_peft_model(model, lora), base)


def record_base(model: nn.Module, base: str) -> nn.Module:
    """Every adapter of ``model`` names ``base`` as the full weights it is trained on
    (``base_model_name_or_path`` in each ``adapter_config.json`` it writes); returns it.

    peft records the folder the model was loaded from. After an in-place switch into a LoRA
    mode the weights are those at the switch (``step_N``), not that folder's, and an adapter
    resumed from a checkpoint written then says that folder too: ``lora_restart`` restarted
    inference on the folder, and served the adapter on other weights (issue 35).
    """
    for adapter in model.peft_config.values():
        adapter.base_model_name_or_path = base
    return model


def build_policy(config: TrainerConfig, point: ResumePoint | None) -> Policy:
    """Load the weights to train for ``config``'s mode, starting at ``point`` (or fresh)."""
    load = {
        "dtype": config.dtype,
        "device": config.device,
        "gradient_checkpointing": config.gradient_checkpointing,
    }
    base = served_at_start(point, config.weight_bridge_mode).model or config.model_name
    if config.is_lora:
        adapter = None if point is None else point.adapter_path
        if adapter is None:
            model = add_fresh_adapter(load_model(base, **load), config, base)
        else:
            model = load_model(base, adapter=adapter, trainable_adapter=True, **load)
            record_base(model, base)
        if config.gradient_checkpointing:
            model.enable_input_require_grads()
        return Policy(model, base)
    if point is not None and point.adapter_path is not None:
        model = load_model(base, adapter=point.adapter_path, **load).merge_and_unload()
        model.requires_grad_(True)
        return Policy(model, base)
    return Policy(load_model(base, **load), base)


def reference_model(config: TrainerConfig) -> nn.Module | None:
    """Frozen copy of the original base for the KL term (full mode, ``beta > 0``).

    LoRA mode needs none: the reference is the same model with the adapter disabled.
    """
    if config.beta == 0 or config.is_lora:
        return None
    model = load_model(config.model_name, dtype=config.dtype, device=config.device)
    model.requires_grad_(False)
    return model.eval()
