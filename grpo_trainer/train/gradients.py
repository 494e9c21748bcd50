"""One step's gradients: every micro-batch's forward and backward pass, accumulated into
the step's gradients (the policy loss over the whole step: ``loss.py``), with the KL
reference's logprobs where ``beta`` > 0, and the sums for the step's metrics
(``step_metrics.py``)."""

from __future__ import annotations

import torch
from torch import nn

from grpo_trainer.ranks.group import Dist
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.data import MicroBatch, StepBatch
from grpo_trainer.train.logprobs import chunked_token_logprobs
from grpo_trainer.train.loss import LossSettings, policy_loss
from grpo_trainer.train.recording import StepRecorder
from grpo_trainer.train.step_metrics import StepSums


def accumulate_gradients(
    model: nn.Module,
    batch: StepBatch,
    *,
    config: TrainerConfig,
    settings: LossSettings,
    reference: nn.Module | None,
    world: Dist,
    version: int,
    recorder: StepRecorder | None,
) -> StepSums:
    """Every micro-batch's forward and backward (gradients accumulate); the sums for the
    step's metrics. ``version`` is the policy trained (its samples are lag 0)."""
    sums = StepSums.of(batch)
    for micro_cpu in batch.micro_batches:
        micro = micro_cpu.to(config.device)
        out = chunked_token_logprobs(
            model,
            micro.input_ids,
            micro.attention_mask,
            micro.temperatures,
            chunk_size=config.logprob_chunk_size,
            with_entropy=True,
            positions=micro.loss_mask,  # the LM head scores trained tokens only
        )
        result = policy_loss(
            out.logprobs,
            micro.inference_logprobs,
            micro.advantages,
            micro.loss_mask,
            settings,
            step_sequences=batch.sequences,
            step_tokens=batch.tokens,
            max_len=config.seq_len,
            ref_logp=reference_logprobs(model, reference, micro, config),
            entropy=out.entropy,
        )
        # FSDP2 averages gradients over ranks; each loss is this rank's share of the sum
        (result.loss * world.world_size).backward()
        sums.add(micro, out.logprobs.detach(), out.entropy, result, version)
        if recorder is not None:
            recorder.capture(out.logprobs, out.entropy, result.ratio)
    return sums


def reference_logprobs(
    model: nn.Module, reference: nn.Module | None, micro: MicroBatch, config: TrainerConfig
) -> torch.Tensor | None:
    """The KL reference's logprobs of the trained tokens (None with ``beta`` 0): the frozen
    ``reference`` model (full modes), else ``model`` with its adapter disabled (LoRA)."""
    if config.beta == 0:
        return None

    def logprobs(scorer: nn.Module) -> torch.Tensor:
        return chunked_token_logprobs(
            scorer,
            micro.input_ids,
            micro.attention_mask,
            micro.temperatures,
            chunk_size=config.logprob_chunk_size,
            positions=micro.loss_mask,
        ).logprobs

    with torch.no_grad():
        if reference is not None:
            return logprobs(reference)
        with model.disable_adapter():
            return logprobs(model)
