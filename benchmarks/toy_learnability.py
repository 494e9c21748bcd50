"""Does a random tiny model learn the toy task by plain GRPO? In one process, no HTTP.

Proves the task is learnable before the whole stack is wired, and finds the tiny-model
shape and hyper-parameters of the quickstart profile, for full fine-tuning and for LoRA.
Prints the mean reward every 10 steps and, at the end, a table of settings side by side:
start reward, steps and seconds to reach the target mean reward, reward of the last steps,
and the share of groups whose scores are all equal (the environment drops those, so a high
share means the real stack generates many groups per step).

    python benchmarks/toy_learnability.py --seeds 0 1 2 3        # the quickstart recipe, full
    python benchmarks/toy_learnability.py --seeds 0 1 2 3 --lora --lora-targets q_proj \\
        k_proj v_proj o_proj --lora-alpha 128                   # ... and its LoRA modes
    python benchmarks/toy_learnability.py --final-norm-weight 1 --beta 0 --warmup 0 --lr 3e-3
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
import time
from dataclasses import dataclass

import torch
from torch import nn

from grpo_trainer.envs.toy import RepeatDigit
from grpo_trainer.models import build_tiny_model, load_model, load_tokenizer
from grpo_trainer.train.optim import lr_factor

LAST = 5
"""Steps averaged for start, end and target rewards (one step's samples are noisy)."""
EQUAL_WINDOW = 10
"""Last steps over which the share of all-equal groups is measured."""


@dataclass(frozen=True)
class Setting:
    """One grid point: tiny-model shape, optimisation, and (when ``lora``) the adapter."""

    lr: float
    group_size: int
    prompts: int
    temperature: float
    init: float
    hidden: int
    final_norm: float
    beta: float
    warmup: int
    seed: int
    lora: bool
    lora_targets: tuple[str, ...]
    lora_r: int
    lora_alpha: int
    rslora: bool
    dtype: str = "float32"
    """``bfloat16``: the weights are rounded to bf16 at the start and after every optimizer
    step (computed in float32: CPU bf16 is slow), as the trainer keeps them on one GPU in
    ``shared_vllm``, where its weights are vLLM's: an update below half a weight's bf16
    spacing is lost."""

    def label(self) -> str:
        """Short description of the trained parameters."""
        if not self.lora:
            return "full" + (" bf16" if self.dtype == "bfloat16" else "")
        targets = (
            "all"
            if self.lora_targets == ("all-linear",)
            else ",".join(t.removesuffix("_proj") for t in self.lora_targets)
        )
        return f"lora r{self.lora_r}a{self.lora_alpha}{'rs' if self.rslora else ''} {targets}"


@dataclass(frozen=True)
class Outcome:
    setting: Setting
    start_reward: float
    steps_to_target: int | None
    seconds_to_target: float | None
    end_reward: float
    equal_groups: float
    steps: int
    step_seconds: list[float]
    step_cpu: list[float]
    """CPU seconds of each step (this process, every thread)."""


def round_to_bf16(model: nn.Module) -> None:
    """Every trainable weight rounded to the nearest bf16 value, kept in float32."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.copy_(param.to(torch.bfloat16).float())


def policy(setting: Setting, path: str, seed: int) -> nn.Module:
    """The tiny model at ``path``, wrapped in a fresh LoRA adapter when the setting asks."""
    model = load_model(path)
    if setting.dtype == "bfloat16":
        round_to_bf16(model)
    if not setting.lora:
        return model
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=setting.lora_r,
        lora_alpha=setting.lora_alpha,
        target_modules=(
            "all-linear" if setting.lora_targets == ("all-linear",) else list(setting.lora_targets)
        ),
        use_rslora=setting.rslora,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def reference_logprobs(
    model: nn.Module, reference: nn.Module | None, ids: torch.Tensor, start: int, temp: float
) -> torch.Tensor:
    """Logits of the frozen start policy: ``reference`` (full) or the adapter disabled (LoRA)."""
    with torch.no_grad():
        if reference is None:
            with model.disable_adapter():
                logits = model(input_ids=ids).logits
        else:
            logits = reference(input_ids=ids).logits
    return torch.log_softmax(logits[:, start - 1 : -1] / temp, -1)


def run(setting: Setting, *, steps: int, target: float, stop: bool, verbose: bool) -> Outcome:
    """Train a fresh tiny model on the toy task and report when mean reward reaches target."""
    seed = setting.seed
    torch.manual_seed(seed)
    rng = random.Random(seed)
    task = RepeatDigit(seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model(
            tmp,
            seed=seed,
            hidden_size=setting.hidden,
            intermediate_size=2 * setting.hidden,
            initializer_range=setting.init,
            final_norm_weight=setting.final_norm,
        )
        tokenizer = load_tokenizer(tmp)
        model = policy(setting, tmp, seed)
        reference = None
        if setting.beta > 0 and not setting.lora:
            reference = load_model(tmp).requires_grad_(False).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=setting.lr)
    start = time.perf_counter()
    rewards: list[float] = []
    equal: list[float] = []
    reached: tuple[int, float] | None = None
    step_seconds: list[float] = []
    step_cpu: list[float] = []
    for step in range(1, steps + 1):
        step_start, cpu_start = time.perf_counter(), time.process_time()
        prompts = [task.sample(rng) for _ in range(setting.prompts)]
        ids = torch.tensor([tokenizer.encode(p.text, add_special_tokens=False) for p in prompts])
        ids = ids.repeat_interleave(setting.group_size, dim=0)
        model.eval()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=setting.temperature,
                top_k=0,
                max_new_tokens=task.default_max_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        completions = out[:, ids.shape[1] :]
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        scores = torch.tensor(
            [task.score(prompts[i // setting.group_size], t) for i, t in enumerate(texts)]
        ).view(setting.prompts, setting.group_size)
        rewards.append(scores.mean().item())
        equal.append((scores.std(1) == 0).float().mean().item())
        if reached is None and sum(rewards[-LAST:]) / len(rewards[-LAST:]) >= target:
            reached = (step, time.perf_counter() - start)
        advantages = (
            (scores - scores.mean(1, keepdim=True)) / scores.std(1, keepdim=True).clamp(min=1e-8)
        ).view(-1)
        model.train()
        logits = model(input_ids=out).logits[:, ids.shape[1] - 1 : -1] / setting.temperature
        logp = torch.log_softmax(logits, -1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
        token_loss = -advantages[:, None] * logp
        if setting.beta > 0:
            ref = reference_logprobs(model, reference, out, ids.shape[1], setting.temperature)
            delta = ref.gather(-1, completions.unsqueeze(-1)).squeeze(-1) - logp
            token_loss = token_loss + setting.beta * (torch.expm1(delta) - delta)  # k3 KL
        mask = (completions != tokenizer.pad_token_id).float()
        loss = ((token_loss * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
        for group in optimizer.param_groups:
            group["lr"] = setting.lr * lr_factor(
                step - 1, warmup_steps=setting.warmup, total_steps=steps, schedule="constant",
                floor=0.0,
            )  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if setting.dtype == "bfloat16":
            round_to_bf16(model)
        step_seconds.append(time.perf_counter() - step_start)
        step_cpu.append(time.process_time() - cpu_start)
        if verbose and (step % 10 == 0 or step == 1):
            elapsed = time.perf_counter() - start
            print(f"  step {step:4d}  reward {rewards[-1]:.3f}  {elapsed:6.1f}s", flush=True)
        if stop and reached is not None:
            break
    return Outcome(
        setting,
        sum(rewards[:LAST]) / len(rewards[:LAST]),
        reached[0] if reached else None,
        reached[1] if reached else None,
        sum(rewards[-LAST:]) / len(rewards[-LAST:]),
        sum(equal[-EQUAL_WINDOW:]) / len(equal[-EQUAL_WINDOW:]),
        len(rewards),
        step_seconds,
        step_cpu,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, nargs="*", default=[1e-3])
    parser.add_argument("--group-size", type=int, nargs="*", default=[8])
    parser.add_argument("--prompts", type=int, nargs="*", default=[16])
    parser.add_argument("--temperature", type=float, nargs="*", default=[1.0])
    parser.add_argument("--init", type=float, nargs="*", default=[0.02],
                        help="tiny-model initializer_range")  # fmt: skip
    parser.add_argument("--hidden", type=int, nargs="*", default=[64],
                        help="tiny-model hidden size (MLP: twice that)")  # fmt: skip
    parser.add_argument("--final-norm-weight", type=float, nargs="*", default=[6.0],
                        help="tiny-model final RMSNorm weight")  # fmt: skip
    parser.add_argument("--beta", type=float, nargs="*", default=[0.04],
                        help="KL-to-start coefficient (k3, as the trainer's beta)")  # fmt: skip
    parser.add_argument("--warmup", type=int, nargs="*", default=[10],
                        help="linear lr warm-up steps (the trainer's warmup_steps)")  # fmt: skip
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter, not all")
    parser.add_argument("--lora-targets", nargs="+", default=["q_proj", "v_proj"],
                        help="module names, or all-linear")  # fmt: skip
    parser.add_argument("--lora-r", type=int, nargs="*", default=[16])
    parser.add_argument("--lora-alpha", type=int, nargs="*", default=[32])
    parser.add_argument("--rslora", action="store_true", help="scale alpha/sqrt(r)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--stop-at-target", action="store_true",
                        help="stop once the target is reached")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    grid = itertools.product(
        args.lr, args.group_size, args.prompts, args.temperature, args.init, args.hidden,
        args.final_norm_weight, args.beta, args.warmup, args.seeds,
        args.lora_r if args.lora else [0], args.lora_alpha if args.lora else [0],
    )  # fmt: skip
    outcomes = []
    for lr, group, prompts, temp, init, hidden, norm, beta, warmup, seed, r, alpha in grid:
        setting = Setting(lr, group, prompts, temp, init, hidden, norm, beta, warmup, seed,
                          args.lora, tuple(args.lora_targets), r, alpha, args.rslora,
                          args.dtype)  # fmt: skip
        print(f"{setting}", flush=True)
        outcomes.append(
            run(setting, steps=args.steps, target=args.target, stop=args.stop_at_target,
                verbose=True)
        )  # fmt: skip
    print(f"\nmean reward >= {args.target}: steps and seconds (in-process, no HTTP); "
          f"start/end = mean of the first/last {LAST} steps; equal = share of all-equal "
          f"groups over the last {EQUAL_WINDOW} steps")  # fmt: skip
    print(f"{'trained':<28} {'init':>5} {'hid':>4} {'norm':>4} {'beta':>5} {'wu':>3} {'lr':>6} "
          f"{'group':>5} {'prompts':>7} {'temp':>4} {'seed':>4} {'start':>6} {'steps':>6} "
          f"{'seconds':>8} {'end':>6} {'equal':>5} {'ran':>4}")  # fmt: skip
    for o in outcomes:
        s = o.setting
        steps = "-" if o.steps_to_target is None else str(o.steps_to_target)
        secs = "-" if o.seconds_to_target is None else f"{o.seconds_to_target:.1f}"
        print(f"{s.label():<28} {s.init:>5} {s.hidden:>4} {s.final_norm:>4g} {s.beta:>5g} "
              f"{s.warmup:>3} {s.lr:>6.0e} {s.group_size:>5} {s.prompts:>7} {s.temperature:>4.1f} "
              f"{s.seed:>4} {o.start_reward:>6.3f} {steps:>6} {secs:>8} {o.end_reward:>6.3f} "
              f"{o.equal_groups:>5.2f} {o.steps:>4}")  # fmt: skip


if __name__ == "__main__":
    main()
