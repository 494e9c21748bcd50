"""Each of the four modes, built-in server, float32: after a sync the server serves the
trainer's current policy under the name the strategy reports to environments (atol 1e-5 on
the logprobs of a fixed prompt + completion) and no longer the pre-sync one. ``none``
reloads in place (one server start) unless its reload is ``restart``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from sync_helpers import ModeServer, SocketSupervisor, server_logprobs, trainer_logprobs
from torch import nn

from grpo_trainer.control import SupervisorLink
from grpo_trainer.models import load_model, load_tokenizer
from grpo_trainer.sync.base import SyncContext, WeightSync
from grpo_trainer.sync.registry import make_strategy

ATOL = 1e-5
"""float32; the server and the trainer run the same ops, differences are rounding only."""
MIN_CHANGE = 1e-3


@pytest.fixture
def link(tmp_path: Path, mode_server: ModeServer) -> Iterator[SupervisorLink]:
    supervisor = SocketSupervisor(tmp_path / "ctl.sock", mode_server.restart)
    link = SupervisorLink(str(supervisor.path), process="trainer")
    yield link
    link.close()
    supervisor.close()


def trainer_model(base_model: Path, mode: str) -> nn.Module:
    model = load_model(base_model)
    if mode.startswith("lora"):
        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    return model


def train(model: nn.Module, strategy: WeightSync, prompt: list[int], completion: list[int]) -> None:
    """Two real optimizer steps raising the completion's logprob, with the strategy's hooks."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    ids = torch.tensor([prompt + completion])
    for _ in range(2):
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        loss = -torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).mean()
        optimizer.zero_grad()
        loss.backward()
        strategy.before_optimizer_step()
        optimizer.step()
        strategy.after_optimizer_step()


@pytest.mark.parametrize(
    "mode_server",
    ["none", "none:restart", "lora_only", "lora_restart", "shared_vllm"],
    indirect=True,
)
def test_after_sync_the_server_serves_the_trainers_policy(
    mode_server: ModeServer, link: SupervisorLink, base_model: Path, tmp_path: Path
) -> None:
    mode = mode_server.mode
    tokenizer = load_tokenizer(base_model)
    prompt, completion = tokenizer.encode("repeat 4:"), tokenizer.encode(" 4444")
    context = SyncContext(
        inference_url=mode_server.url,
        served_model_name="policy",
        checkpoint_dir=tmp_path / "checkpoints",
        backend="builtin",
        none_reload=mode_server.settings.none_reload,
    )
    strategy = make_strategy(mode, context, link=link)
    model = strategy.attach(trainer_model(base_model, mode))
    try:
        name = strategy.served_model
        before = server_logprobs(mode_server.url, name, prompt, completion)
        assert torch.allclose(before, trainer_logprobs(model, prompt, completion), atol=ATOL)

        train(model, strategy, prompt, completion)
        result = strategy.sync(model, 3)

        if mode == "lora_only":
            assert strategy.served_model != name  # a new adapter, a new name
        after = server_logprobs(mode_server.url, strategy.served_model, prompt, completion)
        expected = trainer_logprobs(model, prompt, completion)
        assert torch.allclose(after, expected, atol=ATOL), (after - expected).abs().max()
        assert (after - before).abs().max() > MIN_CHANGE
        assert result.policy_version == 3
        assert result.sync_time > 0
        if mode == "shared_vllm":
            # The server maps the shared file at start: a restart keeps the trained weights.
            mode_server.restart({})
            served = server_logprobs(mode_server.url, strategy.served_model, prompt, completion)
            assert torch.allclose(served, expected, atol=ATOL)
    finally:
        strategy.close()
    restarting = mode == "lora_restart" or mode_server.settings.none_reload == "restart"
    expected_starts = 2 if restarting or mode == "shared_vllm" else 1
    assert mode_server.starts == expected_starts
