"""A user's own task, exactly as docs/environments.md shows it (under 30 lines), run by the
generic runner ``python -m grpo_trainer.envs --task module:Class`` against the real API and
inference server, reporting its metrics on a control socket as under the supervisor."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_procs import Trainer, api_argv, env_argv, free_port

from grpo_trainer.envs.task import Prompt
from grpo_trainer.envs.tokenizer import FastTokenizer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def docs_example() -> str:
    """The first ```python block of the "Your own task" section of the docs."""
    section = DOCS.read_text().split("## Your own task", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def control_socket(tmp_path: Path) -> Iterator[tuple[Path, list[dict], threading.Thread]]:
    """A Unix socket standing in for the supervisor's; collects every record received."""
    path = tmp_path / "control.sock"
    records: list[dict] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn, conn.makefile("r") as lines:
            records.extend(json.loads(line) for line in lines)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, records, thread
    server.close()


def test_docs_example_is_short_and_runs(
    spawn, tmp_path, tiny_model, inference, control_socket
) -> None:
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
        env={"PYTHONPATH": str(tmp_path), "GRPO_TUI_SOCKET": str(control_socket[0]),
             "GRPO_TUI_PROCESS": "env"},
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
    _, records, reader = control_socket
    reader.join(timeout=10)  # the environment closed its connection when it exited
    assert not reader.is_alive()
    assert records[0]["type"] == "hello" and records[0]["process"] == "env"
    sent = [r["data"]["env/groups_sent"] for r in records if r["type"] == "metrics"
            and "env/groups_sent" in r["data"]]  # fmt: skip
    assert sent and sent[-1] == 2
