"""A user's own task, exactly as docs/environments.md shows it (under 30 lines), run by the
generic runner ``python -m grpo_trainer.envs --task module:Class`` against the real API and
inference server."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from env_procs import Trainer, api_argv, env_argv, free_port

from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import FastTokenizer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def docs_example() -> str:
    """The first ```python block of the "Your own task" section of the docs."""
    section = DOCS.read_text().split("## Your own task", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_docs_example_is_short_and_runs(spawn, tmp_path, tiny_model, inference) -> None:
    source = docs_example()
    assert len(source.strip().splitlines()) < 30
    (tmp_path / "echo_task.py").write_text(source)
    spec = importlib.util.spec_from_file_location("echo_task", tmp_path / "echo_task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    task = module.Echo()

    port = free_port()
    api = f"http://127.0.0.1:{port}"
    spawn("api", api_argv(port, tmp_path / "rollouts.db")).wait_http(f"{api}/health")
    trainer = Trainer(api, batch_size=4)
    trainer.register()
    env = spawn(
        "env",
        env_argv("grpo_trainer.envs", api, inference, tiny_model, "--task", "echo_task:Echo",
                 "--group-size", "4", "--max-groups", "2"),
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert env.wait(timeout=120) == 0, env.text()[-3000:]
    assert "'wandb_name': 'Echo_0'" in env.text()
    groups = trainer.take() + trainer.take()
    assert len(groups) == 2
    tokenizer = FastTokenizer.from_dir(tiny_model)
    for group in groups:
        prompt_text = tokenizer.decode(group["tokens"][0][:10])
        assert re.fullmatch(r"echo [a-d]{4}:", prompt_text)
        prompt = Prompt(text=prompt_text, answer=prompt_text[5:9])
        completions = [tokenizer.decode(seq[10:]) for seq in group["tokens"]]
        assert group["scores"] == [task.score(prompt, c) for c in completions]
        assert all(len(seq) - 10 <= task.default_max_tokens for seq in group["tokens"])
    trainer.close()
