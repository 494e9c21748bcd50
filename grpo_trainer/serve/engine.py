"""Batched sampling with a KV cache, returning the logprob of every sampled token.

Concurrent requests are decoded together: the scheduler (``scheduler.py``) hands the
engine every request queued at once, whose prompts are left-padded into one batch (each
prompt's ``n`` rows side by side, attention masked and positions counted from each row's
first real token), run once, then one token per row per step through the model's KV
cache. Each request samples its rows with its own parameters (with its own generator when
it has a ``seed``, so its samples do not depend on the rest of the batch) and leaves the
batch (its rows pruned from the cache) as soon as all its rows have finished.
The adapters and shared weights are per-model state, so a batch runs under the engine
lock with one adapter; the generation gate lets the trainer pause between decode steps.
See ``sampling.py`` for the logprob convention. A request without ``seed`` samples with
the next seed of ``seeds``, a stream the server makes different at every start
(``start_seeds`` in ``__main__``).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_trainer.serve.lora import AdapterSet
from grpo_trainer.serve.pause import Aborted, GenerationGate
from grpo_trainer.serve.sampling import SamplingParams, processed_logprobs, sample_next
from grpo_trainer.serve.scheduler import BatchScheduler, Pending

BATCH_WINDOW = 0.002
"""Seconds without a new request after which an idle engine starts the batch it has."""
BATCH_MAX_WAIT = 0.02
"""The most seconds an idle engine waits for company for the first request."""


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


@dataclass(eq=False)
class Generation:
    """One request in a batch: its prompt, parameters, generator and samples so far."""

    prompt_ids: list[int]
    params: SamplingParams
    samples: list[Sample]
    generator: torch.Generator | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)


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
        max_batch_rows: int = 256,
        batch_window: float = BATCH_WINDOW,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.adapters = adapters
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id or 0)
        self.lock = threading.Lock()
        self.gate = GenerationGate()
        self.stats = EngineStats()
        self.seeds = seeds or random.Random()
        self._batch_generator: torch.Generator | None = None
        self.scheduler: BatchScheduler[Generation] = BatchScheduler(
            self._run_batch, max_rows=max_batch_rows, window=batch_window, max_wait=BATCH_MAX_WAIT
        )

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
        """Sample ``params.n`` completions of ``prompt_ids``, batched with concurrent requests."""
        with self.gate.admit():
            generation = Generation(prompt_ids, params, [Sample() for _ in range(params.n)])
            self.scheduler.submit(generation, adapter=adapter, rows=params.n).result()
            return generation.samples

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, adapter: str | None = None
    ) -> tuple[list[Sample], Future[None]] | None:
        """``generate`` without blocking, for the server's event loop: the samples (filled
        in by the batch) and the future that resolves when they are done; None while
        paused (then ``generate``, in a thread, waits for the resume).

        Awaiting the future on the loop saves each request two thread switches (to a
        worker thread and back), which under one GIL cost more than the hand-off itself.
        """
        if not self.gate.try_enter():
            return None
        try:
            generation = Generation(prompt_ids, params, [Sample() for _ in range(params.n)])
            done = self.scheduler.submit(generation, adapter=adapter, rows=params.n)
        except BaseException:
            self.gate.leave()
            raise
        done.add_done_callback(lambda _: self.gate.leave())
        return generation.samples, done

    def _run_batch(self, batch: list[Pending[Generation]]) -> None:
        """Decode one batch of requests (the scheduler's thread), resolving each when done."""
        with self.lock:
            self._activate(batch[0].adapter)
            self._batch_generator = self._generator(None)
            for pending in batch:
                if pending.item.params.seed is not None:
                    pending.item.generator = self._generator(pending.item.params.seed)
            try:
                self._decode(batch)
            except Aborted:
                for pending in batch:
                    for sample in pending.item.samples:
                        sample.finish_reason = sample.finish_reason or "abort"
            for pending in batch:
                if not pending.future.done():
                    self._finish(pending)

    def _finish(self, pending: Pending[Generation]) -> None:
        """Close a request's samples, count them and wake its caller."""
        generation = pending.item
        for sample in generation.samples:
            sample.finish_reason = sample.finish_reason or "length"
            if sample.finish_reason != "stop" or not isinstance(sample.stop_reason, str):
                sample.text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
            self.stats.finished[sample.finish_reason] += 1
        self.stats.prompt_tokens += len(generation.prompt_ids)
        self.stats.generation_tokens += sum(len(s.token_ids) for s in generation.samples)
        pending.future.set_result(None)

    def _prefill_inputs(
        self, batch: list[Pending[Generation]]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Input ids of every row, left-padded; mask and positions only when padded."""
        longest = max(len(p.item.prompt_ids) for p in batch)
        ids, mask = [], []
        for pending in batch:
            prompt = pending.item.prompt_ids
            pad = longest - len(prompt)
            ids += [[self.pad_id] * pad + prompt] * pending.rows
            mask += [[0] * pad + [1] * len(prompt)] * pending.rows
        input_ids = torch.tensor(ids, device=self.device)
        if all(len(p.item.prompt_ids) == longest for p in batch):
            return input_ids, None, None  # no padding: the model's causal default
        attention = torch.tensor(mask, device=self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        return input_ids, attention, positions

    @torch.inference_mode()
    def _decode(self, batch: list[Pending[Generation]]) -> None:
        eos = self.tokenizer.eos_token_id
        input_ids, attention, positions = self._prefill_inputs(batch)
        out = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True
        )
        active = list(batch)
        step = 0
        while active:
            self.gate.checkpoint()
            next_ids = self._sample_step(active, out.logits[:, -1, :], eos)
            step += 1
            keep = [p for p in active if not p.item.finished and step < p.item.params.max_tokens]
            kept = {id(p) for p in keep}
            for pending in active:
                if id(pending) not in kept:
                    self._finish(pending)
            if not keep:
                return
            if len(keep) < len(active):
                kept_rows, row = [], 0
                for pending in active:
                    if id(pending) in kept:
                        kept_rows += range(row, row + pending.rows)
                    row += pending.rows
                index = torch.tensor(kept_rows, device=self.device)
                out.past_key_values.batch_select_indices(index)
                next_ids = next_ids[index]
                if attention is not None and positions is not None:
                    attention, positions = attention[index], positions[index]
                active = keep
            if attention is not None and positions is not None:
                attention = torch.cat([attention, attention.new_ones(attention.shape[0], 1)], 1)
                positions = positions[:, -1:] + 1
            out = self.model(
                input_ids=next_ids[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )

    def _sample_step(
        self, active: list[Pending[Generation]], logits: torch.Tensor, eos: int
    ) -> torch.Tensor:
        """The next token of every row, recorded in the samples.

        Rows are sampled together per (temperature, top-k, top-p, top_logprobs) and
        generator: a request with its own ``seed`` draws from its own generator (so its
        samples do not depend on what else is in the batch); the others share the batch's.
        """
        groups: dict[tuple[object, ...], list[tuple[Generation, int]]] = {}
        row = 0
        for pending in active:
            item = pending.item
            p = item.params
            owner = id(item) if p.seed is not None else None
            key = (p.temperature, p.top_k, p.top_p, p.top_logprobs, owner)
            groups.setdefault(key, []).append((item, row))
            row += pending.rows
        next_ids = torch.empty(logits.shape[0], dtype=torch.long, device=self.device)
        processed: dict[tuple[object, ...], torch.Tensor] = {}
        for key, members in groups.items():
            params = members[0][0].params
            if key[:3] not in processed:
                processed[key[:3]] = processed_logprobs(
                    logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
                )
            rows = [r for item, start in members for r in range(start, start + item.params.n)]
            index = torch.tensor(rows, device=self.device)
            logprobs = processed[key[:3]].index_select(0, index)
            generator = members[0][0].generator if key[4] is not None else self._batch_generator
            ids = sample_next(logprobs, greedy=params.temperature == 0, generator=generator)
            next_ids[index] = ids
            chosen = logprobs.gather(-1, ids[:, None]).squeeze(-1).tolist()
            top = logprobs.topk(params.top_logprobs, dim=-1) if params.top_logprobs else None
            tokens = ids.tolist()
            offset = 0
            for item, _ in members:
                for sample in item.samples:
                    if sample.finish_reason is None:
                        self._record(sample, tokens[offset], chosen[offset], top, offset, eos,
                                     item.params)  # fmt: skip
                    offset += 1
        return next_ids

    def _record(
        self,
        sample: Sample,
        token: int,
        logprob: float,
        top: torch.return_types.topk | None,
        row: int,
        eos: int,
        params: SamplingParams,
    ) -> None:
        """Append one sampled token (and its top logprobs) to ``sample``; check stops."""
        sample.token_ids.append(token)
        sample.logprobs.append(logprob)
        entry = {token: logprob}
        if top is not None:
            entry |= dict(zip(top.indices[row].tolist(), top.values[row].tolist(), strict=True))
        sample.top_logprobs.append(entry)
        self._check_stop(sample, token, params, eos)

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
