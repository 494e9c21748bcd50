"""Batched sampling with a KV cache, returning the logprob of every sampled token.

The ``n`` completions of one prompt are decoded as one batch: the prompt is run once per
row, then one token per row per step through the model's KV cache. Requests run one at a
time under a lock (the adapters and shared weights are per-model state); the generation
gate lets the trainer pause between decode steps. See ``sampling.py`` for the logprob
convention. A request without ``seed`` samples with the next seed of ``seeds``, a stream
the server makes different at every start (``start_seeds`` in ``__main__``).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_trainer.serve.lora import AdapterSet
from grpo_trainer.serve.pause import Aborted, GenerationGate
from grpo_trainer.serve.sampling import SamplingParams, processed_logprobs, sample_next


@dataclass
class Sample:
    """One completion: its tokens, their processed logprobs and why it ended."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass
class EngineStats:
    """Counters behind ``/metrics``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: Counter[str] = field(default_factory=Counter)


class Engine:
    """A causal LM that samples completions and scores prompts."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_model_len: int,
        adapters: AdapterSet | None = None,
        seeds: random.Random | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.adapters = adapters
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.lock = threading.Lock()
        self.gate = GenerationGate()
        self.stats = EngineStats()
        self.seeds = seeds or random.Random()

    def _generator(self, seed: int | None) -> torch.Generator:
        """A request's own ``seed`` reproduces its samples; else the next from ``seeds``."""
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else self.seeds.getrandbits(63))
        return generator

    def _activate(self, adapter: str | None) -> None:
        if self.adapters is not None:
            self.adapters.activate(adapter)

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, adapter: str | None = None
    ) -> list[Sample]:
        """Sample ``params.n`` completions of ``prompt_ids`` as one batch."""
        with self.gate.admit(), self.lock:
            self._activate(adapter)
            samples = [Sample() for _ in range(params.n)]
            try:
                self._decode(prompt_ids, params, samples)
            except Aborted:
                for sample in samples:
                    sample.finish_reason = sample.finish_reason or "abort"
            for sample in samples:
                sample.finish_reason = sample.finish_reason or "length"
                if sample.finish_reason != "stop" or not isinstance(sample.stop_reason, str):
                    sample.text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
                self.stats.finished[sample.finish_reason] += 1
            self.stats.prompt_tokens += len(prompt_ids)
            self.stats.generation_tokens += sum(len(s.token_ids) for s in samples)
            return samples

    @torch.inference_mode()
    def _decode(self, prompt_ids: list[int], params: SamplingParams, samples: list[Sample]) -> None:
        generator = self._generator(params.seed)
        greedy = params.temperature == 0
        eos = self.tokenizer.eos_token_id
        input_ids = torch.tensor([prompt_ids] * params.n, device=self.device)
        out = self.model(input_ids=input_ids, use_cache=True)
        for _ in range(params.max_tokens):
            self.gate.checkpoint()
            logprobs = processed_logprobs(
                out.logits[:, -1, :],
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
            )
            next_ids = sample_next(logprobs, greedy=greedy, generator=generator)
            chosen = logprobs.gather(-1, next_ids[:, None]).squeeze(-1).tolist()
            top = logprobs.topk(params.top_logprobs, dim=-1) if params.top_logprobs else None
            for row, sample in enumerate(samples):
                if sample.finish_reason is not None:
                    continue
                token = int(next_ids[row])
                sample.token_ids.append(token)
                sample.logprobs.append(chosen[row])
                entry = {token: chosen[row]}
                if top is not None:
                    entry |= dict(
                        zip(top.indices[row].tolist(), top.values[row].tolist(), strict=True)
                    )
                sample.top_logprobs.append(entry)
                self._check_stop(sample, token, params, eos)
            if all(s.finish_reason is not None for s in samples):
                return
            out = self.model(
                input_ids=next_ids[:, None], past_key_values=out.past_key_values, use_cache=True
            )

    def _check_stop(self, sample: Sample, token: int, params: SamplingParams, eos: int) -> None:
        if token in params.stop_token_ids:
            sample.finish_reason, sample.stop_reason = "stop", token
        elif token == eos and not params.ignore_eos:
            sample.finish_reason = "stop"
        elif params.stop:
            text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
            hits = [(text.find(s), s) for s in params.stop if s in text]
            if hits:
                cut, stop = min(hits)
                sample.finish_reason, sample.stop_reason, sample.text = "stop", stop, text[:cut]

    @torch.inference_mode()
    def score(
        self,
        prompt_ids: list[int],
        *,
        temperature: float,
        adapter: str | None = None,
        top_logprobs: int = 0,
    ) -> tuple[list[float | None], list[dict[int, float] | None]]:
        """Logprob of each prompt token given the ones before it (None for the first).

        Uses ``log_softmax(logits / T)`` (raw logits for T = 0); top-k / top-p do not apply.
        """
        with self.gate.admit(), self.lock:
            self._activate(adapter)
            input_ids = torch.tensor([prompt_ids], device=self.device)
            logits = self.model(input_ids=input_ids).logits[0, :-1]
            logprobs = processed_logprobs(logits, temperature=temperature)
            targets = input_ids[0, 1:, None]
            chosen = logprobs.gather(-1, targets).squeeze(-1).tolist()
            tops: list[dict[int, float] | None] = [None]
            for position, value in enumerate(chosen):
                entry = {prompt_ids[position + 1]: value}
                if top_logprobs:
                    best = logprobs[position].topk(top_logprobs)
                    entry |= dict(zip(best.indices.tolist(), best.values.tolist(), strict=True))
                tops.append(entry)
            self.stats.prompt_tokens += len(prompt_ids)
            self.stats.finished["length"] += 1
            return [None, *chosen], tops
