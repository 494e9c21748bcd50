"""Does a random tiny model learn the toy task by plain GRPO? In one process, no HTTP.

Proves the task is learnable before the whole stack is wired, and finds hyper-parameters
for the quickstart profile. Prints the mean reward per step and, at the end, a table of
settings side by side: steps and seconds to reach 0.8 mean reward.

    python benchmarks/toy_learnability.py               # the default grid
    python benchmarks/toy_learnability.py --lr 3e-3 --group-size 8 --prompts 16
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import dataclass

import torch

from grpo_trainer.envs.toy import RepeatDigit
from grpo_trainer.models import build_tiny_model, load_model, load_tokenizer


@dataclass(frozen=True)
class Setting:
    lr: float
    group_size: int
    prompts: int
    temperature: float


@dataclass(frozen=True)
class Outcome:
    setting: Setting
    start_reward: float
    steps_to_target: int | None
    seconds_to_target: float | None
    final_reward: float


def run(setting: Setting, *, steps: int, target: float, seed: int, verbose: bool) -> Outcome:
    """Train a fresh tiny model on the toy task and report when mean reward reaches target."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    task = RepeatDigit(seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model(tmp, seed=seed)
        tokenizer = load_tokenizer(tmp)
        model = load_model(tmp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=setting.lr)
    start = time.perf_counter()
    first: float | None = None
    reached: tuple[int, float] | None = None
    reward = 0.0
    for step in range(1, steps + 1):
        prompts = [task.sample(rng) for _ in range(setting.prompts)]
        ids = torch.tensor([tokenizer.encode(p.text, add_special_tokens=False) for p in prompts])
        ids = ids.repeat_interleave(setting.group_size, dim=0)
        model.eval()
        with torch.no_grad():
            out = model.generate(
                ids,
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
        reward = scores.mean().item()
        first = reward if first is None else first
        if reached is None and reward >= target:
            reached = (step, time.perf_counter() - start)
        advantages = (
            (scores - scores.mean(1, keepdim=True)) / scores.std(1, keepdim=True).clamp(min=1e-8)
        ).view(-1)
        model.train()
        logits = model(out).logits[:, ids.shape[1] - 1 : -1] / setting.temperature
        logp = torch.log_softmax(logits, -1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
        mask = (completions != tokenizer.pad_token_id).float()
        seq_logp = (logp * mask).sum(1) / mask.sum(1).clamp(min=1)
        loss = -(advantages * seq_logp).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if verbose and (step % 10 == 0 or step == 1):
            print(f"  step {step:4d}  reward {reward:.3f}  {time.perf_counter() - start:6.1f}s")
    return Outcome(
        setting,
        first or 0.0,
        reached[0] if reached else None,
        reached[1] if reached else None,
        reward,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, nargs="*", default=[3e-3, 1e-2])
    parser.add_argument("--group-size", type=int, nargs="*", default=[8])
    parser.add_argument("--prompts", type=int, nargs="*", default=[4, 16])
    parser.add_argument("--temperature", type=float, nargs="*", default=[1.0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    outcomes = []
    for lr in args.lr:
        for group_size in args.group_size:
            for prompts in args.prompts:
                for temperature in args.temperature:
                    setting = Setting(lr, group_size, prompts, temperature)
                    print(f"{setting}", flush=True)
                    outcomes.append(
                        run(setting, steps=args.steps, target=args.target, seed=args.seed,
                            verbose=True)
                    )  # fmt: skip
    print(f"\nmean reward >= {args.target}: steps and seconds (in-process, no HTTP)")
    print(f"{'lr':>8} {'group':>5} {'prompts':>7} {'temp':>5} {'start':>6} {'steps':>6} "
          f"{'seconds':>8} {'final':>6}")  # fmt: skip
    for o in outcomes:
        s = o.setting
        steps = "-" if o.steps_to_target is None else str(o.steps_to_target)
        secs = "-" if o.seconds_to_target is None else f"{o.seconds_to_target:.1f}"
        print(f"{s.lr:>8.0e} {s.group_size:>5} {s.prompts:>7} {s.temperature:>5.1f} "
              f"{o.start_reward:>6.3f} {steps:>6} {secs:>8} {o.final_reward:>6.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
