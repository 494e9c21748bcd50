"""What recording costs the trainer: the quickstart's step with and without the records.

Side by side in one process, in alternating blocks (A B A B ...: load and thermal drift hit
both alike): the quickstart's trainer recipe (the tiny model on CPU, 16 groups of 8
sequences a step, ``beta`` 0.04, one torch thread) trained by :class:`Trainer.run` from a
file of quickstart-shaped groups, once with no recorder and once with the trainer's
:class:`StepRecorder` (every group recorded, the step's spans on the timeline). Each batch
is handed out after ``--data-wait`` seconds, the trainer's wait for its batch in the
quickstart (0.43 s, references.md §7; the recorder writes during it); ``--data-wait 0`` is
the worst case, a trainer that never waits. A step's time is the sum of its
``phase/<phase>_s`` (the whole loop iteration). Prints the median step of each side and
the overhead, the CPU the recording thread spent per step, and the cost of the recorder's
calls on the training thread.

    python benchmarks/records_overhead.py [--blocks 6] [--steps 20] [--data-wait 0.43] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from grpo_trainer.models import build_tiny_model, load_model, load_tokenizer
from grpo_trainer.train.config import TrainerConfig
from grpo_trainer.train.loop import Trainer
from grpo_trainer.train.recording import StepRecorder, fast_decode
from grpo_trainer.train.reporter import Reporter
from grpo_trainer.train.sources import FileSource

GROUPS, GROUP_SIZE, COMPLETION = 16, 8, 6


def quickstart_groups(tokenizer, steps: int, seed: int = 0) -> list[dict]:
    """Toy-task groups: ``repeat D:`` and six sampled digits, inference logprobs as sampled."""
    rng = random.Random(seed)
    groups = []
    for _ in range(steps * GROUPS):
        digit = rng.randrange(10)
        prompt = tokenizer.encode(f"repeat {digit}:", add_special_tokens=False)
        tokens, logprobs, scores = [], [], []
        for _ in range(GROUP_SIZE):
            completion = [tokenizer.encode(str(rng.randrange(10)))[0] for _ in range(COMPLETION)]
            tokens.append(prompt + completion)
            logprobs.append([1.0] * len(prompt) + [-rng.uniform(0.5, 3.0) for _ in completion])
            scores.append(rng.random())
        groups.append(
            {
                "tokens": tokens,
                "masks": [[-100] * len(prompt) + seq[len(prompt) :] for seq in tokens],
                "scores": scores,
                "inference_logprobs": logprobs,
                "policy_version": 0,
                "env_id": 0,
                "env_name": "toy",
            }
        )
    return groups


class WaitingSource(FileSource):
    """The file's batches, each after ``wait`` seconds (the environments' production)."""

    def __init__(self, path: Path, step_batch_size: int, wait: float) -> None:
        super().__init__(path, step_batch_size)
        self.delay = wait

    def next_batch(self, step, should_stop):
        time.sleep(self.delay)
        return super().next_batch(step, should_stop)


def block(
    model_dir: Path, batches: Path, work: Path, steps: int, record: bool, wait: float
) -> tuple[list[float], float]:
    """Train ``steps`` steps; each step's loop seconds (the first two dropped: warm-up) and
    the CPU seconds the recorder's thread spent per step."""
    config = TrainerConfig(
        model_name=str(model_dir),
        lr=1e-3,
        beta=0.04,
        batch_size=GROUPS * GROUP_SIZE,
        seq_len=64,
        training_steps=steps,
        save_path=str(work / "ckpt"),
        sync_every=0,
        checkpoint_interval=0,
    )
    tokenizer = load_tokenizer(model_dir)
    recorder = StepRecorder(work, "trainer", tokenizer.decode, max_mb=1024) if record else None
    metrics = work / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    trainer = Trainer(
        config,
        load_model(model_dir),
        tokenizer,
        base=str(model_dir),
        source=WaitingSource(batches, config.step_batch_size, wait),
        reporter=Reporter(None, metrics),
        reference=load_model(model_dir),
        recorder=recorder,
    )
    trainer.run()
    busy = recorder.background.busy / steps if recorder is not None else 0.0
    seconds = []
    for line in metrics.read_text().splitlines():
        data = json.loads(line)["data"]
        seconds.append(
            sum(v for k, v in data.items() if k.startswith("phase/") and k.endswith("_s"))
        )
    return seconds[2:], busy


def call_costs(model_dir: Path, work: Path) -> dict[str, float]:
    """Microseconds on the calling thread: a trainer step's capture + record calls, an
    environment's record of a dropped group, one timeline span."""
    from grpo_trainer.envs.groups import Group
    from grpo_trainer.envs.recording import EnvRecorder
    from grpo_trainer.train.data import build_step_batch, parse_groups

    tokenizer = load_tokenizer(model_dir)
    raw = quickstart_groups(tokenizer, 1, seed=1)
    groups = parse_groups(raw)
    batch = build_step_batch(groups, micro_batch_size=128, seq_len=64, pad_id=0)
    recorder = StepRecorder(work, "cost", fast_decode(tokenizer), max_mb=64)
    logp = torch.randn(128, batch.micro_batches[0].input_ids.shape[1] - 1)
    costs = []
    for step in range(1, 51):
        started = time.perf_counter()
        recorder.begin_step(step)
        recorder.capture(logp, logp, logp)
        recorder.record(step, groups, batch, step - 1)
        costs.append(time.perf_counter() - started)
    recorder.close()
    env = EnvRecorder(work, "env", tokenizer.decode, max_mb=64)
    group = Group(
        raw[0]["tokens"], raw[0]["masks"], raw[0]["inference_logprobs"], [0.0] * 8, 1.0, 0
    )
    env_costs, span_costs = [], []
    for _ in range(200):
        started = time.perf_counter()
        env.dropped(group, step=1, env="toy", env_id=0, lag=0)
        env_costs.append(time.perf_counter() - started)
        started = time.perf_counter()
        env.timeline.add("generate", 0.0, 1.0)
        span_costs.append(time.perf_counter() - started)
    env.close()
    return {
        "trainer step: begin + capture + record": statistics.median(costs) * 1e6,
        "environment: a dropped group": statistics.median(env_costs) * 1e6,
        "a timeline span": statistics.median(span_costs) * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6, help="blocks of each side")
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--data-wait", type=float, default=0.43, help="seconds per batch")
    parser.add_argument("--out", type=Path, help="write the table here (markdown)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="records-overhead-") as tmp:
        root = Path(tmp)
        model_dir = build_tiny_model(root / "model", seed=0)
        batches = root / "batches.jsonl"
        groups = quickstart_groups(load_tokenizer(model_dir), args.steps)
        batches.write_text("".join(json.dumps(g) + "\n" for g in groups))
        sides: dict[bool, list[float]] = {False: [], True: []}
        blocks: dict[bool, list[float]] = {False: [], True: []}
        busy: list[float] = []
        for index in range(2 * args.blocks):
            record = bool(index % 2)
            work = root / f"block{index}"
            work.mkdir()
            seconds, cpu = block(model_dir, batches, work, args.steps, record, args.data_wait)
            sides[record] += seconds
            blocks[record].append(statistics.median(seconds))
            busy += [cpu] if record else []
        costs = call_costs(model_dir, root / "costs")
    off, on = statistics.median(sides[False]), statistics.median(sides[True])
    load = os.getloadavg()[0]
    lines = [
        f"trainer step, quickstart recipe on CPU ({os.cpu_count()} cores, load avg {load:.1f}), "
        f"data wait {args.data_wait:g} s; {args.blocks} blocks x {args.steps - 2} steps per "
        "side, alternating",
        "",
        "| | step median ms | p90 ms | steps |",
        "|---|---|---|---|",
    ]
    for name, values in (("no recording", sides[False]), ("recording", sides[True])):
        median, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
        lines.append(f"| {name} | {median * 1000:.1f} | {p90 * 1000:.1f} | {len(values)} |")
    spread = [b / a - 1 for a, b in zip(blocks[False], blocks[True], strict=True)]
    thread = statistics.median(busy)
    lines += [
        "",
        f"wall-clock overhead: {(on - off) / off:+.2%} of the trainer step (target <= 1%); "
        f"block pairs ranged {min(spread):+.0%} .. {max(spread):+.0%} (the machine's load)",
        f"recording thread: {thread * 1000:.2f} ms of CPU per step = {thread / off:.2%} of the "
        "step",
        "",
    ]
    lines += ["| call on the hot thread | median µs |", "|---|---|"]
    lines += [f"| {name} | {value:.1f} |" for name, value in costs.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
