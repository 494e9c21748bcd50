"""Where an environment's tokenizer comes from, and which failures fall back to transformers.

A name that is not a local directory is looked up on the Hugging Face hub (tokenizer files
only). The failures that mean "not there" (no hub access and nothing cached, no such repo,
not a repo id) fall back to transformers, which says why in its own words; anything else
surfaces. Each case runs in a child process with the hub offline and a cache of the test's
own (``HF_HUB_OFFLINE``/``HF_HUB_CACHE`` are read when huggingface_hub is imported).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LOAD = (
    "import sys\n"
    "from grpo_trainer.envs.tokenizer import load_prompt_tokenizer\n"
    "try:\n"
    "    tokenizer = load_prompt_tokenizer(sys.argv[1])\n"
    "except Exception as exc:\n"
    "    print(f'{type(exc).__name__}: {exc}')\n"
    "else:\n"
    "    print(f'loaded {type(tokenizer).__name__}')\n"
)
REVISION = "0" * 40


def load(name: str, cache: Path) -> str:
    """What ``load_prompt_tokenizer(name)`` did in a child with the hub offline."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, name], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def cached_repo(cache: Path, repo: str, files: dict[str, str]) -> None:
    """``files`` as the hub cache holds a snapshot of ``repo`` at its ``main`` revision."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REVISION)
    snapshot = root / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)


def test_a_hub_tokenizer_that_cannot_be_read_surfaces_naming_the_file(
    tiny_model: Path, tmp_path: Path
) -> None:
    good = (tiny_model / "tokenizer.json").read_text()
    cached_repo(tmp_path, "grpo-tui-test/tiny", {"tokenizer.json": good})
    cached_repo(tmp_path, "grpo-tui-test/corrupt", {"tokenizer.json": good[: len(good) // 2]})
    assert load("grpo-tui-test/tiny", tmp_path) == "loaded FastTokenizer"
    answer = load("grpo-tui-test/corrupt", tmp_path)
    assert answer.startswith("ValueError: "), answer
    assert f"{REVISION}/tokenizer.json: the tokenizers library cannot read it" in answer


def test_a_name_that_is_not_there_lets_transformers_say_why(tmp_path: Path) -> None:
    for name in ("grpo-tui-test/absent", str(tmp_path / "no-such-model")):
        answer = load(name, tmp_path)
        assert answer.startswith("OSError: "), answer  # transformers' own words
