"""Base weights named as in a checkpoint whatever LoRA wrapping a server does, and full
weights reloaded in place (mode ``none`` without a restart).

Real peft wrapping on the tiny model (what the built-in server does with LoRA slots). vLLM
cannot run on this CPU machine: its LoRA wrapper is mirrored by a module of the same shape
(``base_layer`` plus ``set_lora``, as ``vllm.lora.layers.BaseLayerWithLoRA``) to check that
the worker extension's loads see the checkpoint's names (vllm-project/vllm#39934) and put
the wrappers back; the GPU run proves it on vLLM itself (docs/inference.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.serve.weights import reload_from_disk, served_parameters
from grpo_trainer.sync.vllm_worker import lora_unwrapped, parameter


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("weights") / "model", seed=5)


def test_lora_slots_change_no_name_and_a_reload_copies_into_the_same_tensors(
    model_dir: Path, tmp_path: Path
) -> None:
    plain = load_model(model_dir)
    names = [name for name, _ in served_parameters(plain)]
    wrapped = get_peft_model(load_model(model_dir), LoraConfig(r=4, target_modules=["q_proj"]))
    assert [name for name, _ in served_parameters(wrapped.get_base_model())] == names
    assert any(".base_layer." in name for name, _ in wrapped.named_parameters())

    trained = load_model(model_dir)
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(0.01)
    trained.save_pretrained(tmp_path / "step_1")
    server = wrapped.get_base_model()
    storage = {name: param.data_ptr() for name, param in served_parameters(server)}
    assert reload_from_disk(server, tmp_path / "step_1") == len(names)
    for (name, param), (_, want) in zip(
        served_parameters(server), served_parameters(trained), strict=True
    ):
        assert torch.equal(param, want), name
        assert param.data_ptr() == storage[name], "copied in place, not replaced"


def test_a_folder_that_does_not_fit_is_refused_before_anything_changes(
    model_dir: Path, tmp_path: Path
) -> None:
    server = load_model(model_dir)
    before = {name: param.clone() for name, param in served_parameters(server)}
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        reload_from_disk(server, tmp_path)
    other = build_tiny_model(tmp_path / "wider", seed=5, hidden_size=32)
    with pytest.raises(ValueError, match=r"does not fit the served model .*other shape"):
        reload_from_disk(server, other)
    assert all(torch.equal(p, before[n]) for n, p in served_parameters(server))


class LoraWrapper(nn.Module):
    """The shape of vLLM's ``BaseLayerWithLoRA``: the layer as ``base_layer``, plus
    ``set_lora``; its adapter tensors are plain attributes, not parameters."""

    def __init__(self, base_layer: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.lora_a_stacked = torch.zeros(2, 4)

    def set_lora(self, index: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Stands in for vLLM's slot write (never called here)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x)


def test_the_worker_loads_under_checkpoint_names_with_the_wrappers_set_aside(
    model_dir: Path,
) -> None:
    model = load_model(model_dir)
    attention = model.model.layers[0].self_attn
    original = attention.q_proj
    attention.q_proj = LoraWrapper(original)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert name not in dict(model.named_parameters())  # what vLLM's loaders trip on
    assert parameter(model, name) is original.weight
    with lora_unwrapped(model):
        assert attention.q_proj is original
        assert dict(model.named_parameters())[name] is original.weight
    assert isinstance(attention.q_proj, LoraWrapper), "the wrapper is back"
    with pytest.raises(RuntimeError, match="load failed"), lora_unwrapped(model):
        raise RuntimeError("load failed")
    assert isinstance(attention.q_proj, LoraWrapper), "back after a failure too"
