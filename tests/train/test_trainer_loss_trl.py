"""Our trainer's loss path against TRL 1.16's own ``GRPOTrainer._compute_loss``.

The same real tiny model, prompts, completions (some padded), advantages and sampling
logprobs go through TRL's loss (its fused LM head over the completion tokens) and through
ours (the LM head at the loss mask's positions, ``positions``, then ``policy_loss``); the
losses and every parameter's gradient must agree to float32 rounding. With ``beta > 0`` TRL
1.16 multiplies the KL by the importance ratio by default (``use_bias_correction_kl``,
DeepSeek-V3.2); ours is DeepSeekMath's k3 alone, so that switch is off here. TRL is a
development dependency (``[dev]`` in pyproject.toml, pinned to 1.16.x for that reason).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trl
from train_helpers import tiny_model

from grpo_trainer.models import load_model
from grpo_trainer.train.logprobs import chunked_token_logprobs
from grpo_trainer.train.loss import LossSettings, policy_loss

B, PROMPT, COMPLETION = 4, 5, 6


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("trl-loss") / "model")


def trl_trainer(model_path: Path, tmp_path: Path, loss_type: str, beta: float):
    from datasets import Dataset

    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=B, num_generations=2,
        max_completion_length=COMPLETION, loss_type=loss_type, beta=beta, epsilon=0.2,
        use_cpu=True, bf16=False, report_to="none", model_init_kwargs={"dtype": "float32"},
        use_bias_correction_kl=False,  # TRL's default multiplies the KL by the ratio (DSV3.2)
    )  # fmt: skip
    data = Dataset.from_dict({"prompt": ["ab"] * B})
    trainer = trl.GRPOTrainer(
        model=str(model_path), reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=config, train_dataset=data,
    )  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


@pytest.mark.parametrize(("loss_type", "beta"), [("grpo", 0.0), ("grpo", 0.04),
                                                 ("dapo", 0.0), ("dr_grpo", 0.0)])  # fmt: skip
def test_loss_and_gradients_equal_trls_compute_loss(
    model_path: Path, tmp_path: Path, loss_type: str, beta: float
) -> None:
    trainer = trl_trainer(model_path, tmp_path, loss_type, beta)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 44, (B, PROMPT), generator=g)
    completion = torch.randint(5, 44, (B, COMPLETION), generator=g)
    completion_mask = torch.ones(B, COMPLETION)
    completion_mask[1, 4:] = 0  # padded completions
    completion_mask[3, 2:] = 0
    advantages = torch.randn(B, generator=g)
    old = -torch.rand(B, COMPLETION, generator=g) * 3  # the sampler's logprobs
    ref = old + torch.randn(B, COMPLETION, generator=g) * 0.1
    inputs = {
        "prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion, "completion_mask": completion_mask,
        "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": completion_mask.sum(),
    }  # fmt: skip
    model = trainer.model
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}

    ours = load_model(model_path, dtype="float32")
    ours.train()
    ids = torch.cat([prompt, completion], 1)
    mask = torch.zeros(B, ids.shape[1] - 1)  # label t+1 at position t: the completion's
    mask[:, PROMPT - 1 :] = completion_mask

    def at_completion(values: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(B, ids.shape[1] - 1)
        full[:, PROMPT - 1 :] = values
        return full

    out = chunked_token_logprobs(
        ours, ids, torch.ones_like(ids), torch.ones(B), chunk_size=3, positions=mask
    )
    loss = policy_loss(
        out.logprobs, at_completion(old), advantages[:, None].expand(B, ids.shape[1] - 1),
        mask, LossSettings(loss_type=loss_type, beta=beta), step_sequences=B,
        step_tokens=int(mask.sum()), max_len=COMPLETION, ref_logp=at_completion(ref),
    ).loss  # fmt: skip
    loss.backward()
    assert abs(float(loss) - float(trl_loss)) <= 1e-5 * abs(float(trl_loss)) + 1e-7
    for name, param in ours.named_parameters():
        expected = want[name]
        scale = expected.abs().max().clamp(min=1e-8)
        assert float((param.grad - expected).abs().max() / scale) < 1e-4, name
