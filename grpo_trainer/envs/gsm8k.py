"""GSM8K: grade-school math word problems, answered in ``\\boxed{}``, verified by math-verify.

Prompt: a system message asking the model to reason inside ``<think> </think>`` and to end
with ``\\boxed{answer}`` (the Atropos GSM8K convention), then the question as the user.

Score: +1 when the boxed answer after the last ``</think>`` (or anywhere, when the model
wrote no think block) is mathematically equal to the reference answer (``math-verify``,
so ``72``, ``72.0``, ``\\frac{144}{2}`` and ``72 \\text{ dollars}`` all count), else -1.
Length handling: a completion cut off by ``max_tokens`` scores -1 without being parsed
(it never reached its final answer); groups whose every score is equal are dropped by the
runner's rule, and sequences longer than the API's ``max_token_len`` drop their group.

Data: ``--data-file`` JSONL (one ``{"question": ..., "answer": ...}`` per line; the answer
may be the full GSM8K solution ending in ``#### 72`` or just ``72``) for offline use, with
bad lines reported by line number and skipped; the last tenth of the file is held out for
evaluation. Without a file: the ``openai/gsm8k`` dataset from the hub (``train`` to
train on, ``test`` held out), through ``datasets`` (the ``gsm8k`` extra).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

from grpo_trainer.envs.task import Prompt, Task

log = logging.getLogger("grpo_trainer.envs")

SYSTEM_PROMPT = (
    "Think the problem through step by step before you answer. Put all of your reasoning "
    "between <think> and </think> tags. After </think>, give only the final answer, "
    "written as \\boxed{answer}. An answer that is not inside \\boxed{} gets no credit."
)
HUB_DATASET = ("openai/gsm8k", "main")


@dataclass(frozen=True)
class Problem:
    """One question and its reference answer (the number after ``####``)."""

    question: str
    answer: str


def reference_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after ``####``, commas removed."""
    return solution.split("####")[-1].strip().replace(",", "")


def read_jsonl(path: Path) -> tuple[list[Problem], list[str]]:
    """Problems from a JSONL file, and one ``path:line: reason`` per bad line (skipped)."""
    problems, bad = [], []
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                bad.append(f"{path}:{number}: not JSON ({exc.msg})")
                continue
            if not isinstance(record, dict):
                bad.append(f"{path}:{number}: expected an object, got {type(record).__name__}")
                continue
            question, answer = record.get("question"), record.get("answer")
            if not isinstance(question, str) or not question.strip():
                bad.append(f"{path}:{number}: 'question' missing or not a non-empty string")
                continue
            if not isinstance(answer, str | int | float) or not reference_answer(str(answer)):
                bad.append(f"{path}:{number}: 'answer' missing or empty")
                continue
            problems.append(Problem(question.strip(), reference_answer(str(answer))))
    return problems, bad


def load_hub_split(split: str) -> list[Problem]:
    """A split of GSM8K from the Hugging Face hub (needs ``pip install grpo-tui[gsm8k]``)."""
    try:
        from datasets import load_dataset
    except ImportError as exc:
        raise OSError(
            "GSM8K from the hub needs the 'datasets' package (pip install 'grpo-tui[gsm8k]'), "
            "or pass --data-file with a local JSONL copy"
        ) from exc
    rows = load_dataset(*HUB_DATASET, split=split)
    return [Problem(row["question"], reference_answer(row["answer"])) for row in rows]


def score_completion(completion: str, answer: str) -> float:
    """+1 if the completion's boxed final answer equals ``answer`` (math-verify), else -1."""
    from math_verify import LatexExtractionConfig, parse, verify

    final = completion.rsplit("</think>", 1)[-1]
    extraction = [LatexExtractionConfig(boxed_match_priority=0)]
    gold = parse(f"\\boxed{{{answer}}}", extraction_config=extraction)
    predicted = parse(final, extraction_config=extraction, extraction_mode="first_match")
    if not gold or not predicted:
        return -1.0
    return 1.0 if verify(gold, predicted) else -1.0


class Gsm8k(Task):
    """GSM8K with the think-then-box prompt and math-verify scoring (+1 / -1)."""

    name = "gsm8k"
    default_max_tokens = 1024
    truncated_score = -1.0
    correct_threshold = 1.0

    def __init__(self, *, seed: int = 0, data_file: Path | None = None) -> None:
        super().__init__(seed=seed, data_file=data_file)
        self.bad_lines: list[str] = []
        if data_file is not None:
            problems, self.bad_lines = read_jsonl(data_file)
            for line in self.bad_lines:
                log.warning("bad data line skipped: %s", line)
            if self.bad_lines:
                log.warning("%d bad line(s) skipped in %s", len(self.bad_lines), data_file)
            if len(problems) < 2:
                raise ValueError(
                    f"{data_file} holds {len(problems)} usable problem(s); need at least 2 "
                    "(one to train on, one held out)"
                )
            held_out = max(1, len(problems) // 10)
            self.train, self.held_out = problems[:-held_out], problems[-held_out:]
        else:
            self.train, self.held_out = load_hub_split("train"), load_hub_split("test")

    def prompt(self, problem: Problem) -> Prompt:
        """The chat prompt for one problem."""
        messages = (
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": problem.question},
        )
        return Prompt(messages=messages, answer=problem.answer)

    def sample(self, rng: random.Random) -> Prompt:
        return self.prompt(rng.choice(self.train))

    def score(self, prompt: Prompt, completion: str) -> float:
        return score_completion(completion, prompt.answer)

    def eval_prompts(self, size: int) -> list[Prompt]:
        """The first ``size`` held-out problems (a fixed set, comparable across steps)."""
        return [self.prompt(p) for p in self.held_out[:size]]


if __name__ == "__main__":
    from grpo_trainer.envs.cli import main

    main(Gsm8k)
