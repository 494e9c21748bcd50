"""A weight sync that cannot start is a configuration problem: exit 2, one line, no traceback."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
from free_ports import free_port
from train_helpers import (
    REPO,
    make_groups,
    run_trainer,
    tiny_model,
    trainer_command,
    trainer_env,
    write_groups,
)

from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.train.__main__ import main


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sync-start")
    model = tiny_model(root / "model")
    data = write_groups(root / "groups.jsonl", make_groups(model, count=2, group_size=2, seed=4))
    return model, data


MESSAGE = (
    "mode {mode} needs the grpo-tui supervisor: run it under grpo-tui or use "
    "--sync-every 0 (GRPO_TUI_SOCKET is not set)"
)


def test_mode_none_without_supervisor_exits_2_with_one_line(setup, tmp_path: Path) -> None:
    model, data = setup
    command = trainer_command(
        model, tmp_path / "ckpt", data, "--weight-bridge-mode", "none", "--sync-every", "1",
        "--none-reload", "restart",
    )  # fmt: skip
    result = run_trainer(command, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == ["error: " + MESSAGE.format(mode="none")]
    assert not (tmp_path / "ckpt").exists(), "nothing is written before the check"


def test_lora_restart_without_supervisor_is_refused_before_loading(
    setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process (``main`` is what ``python -m grpo_trainer.train`` exits with)."""
    monkeypatch.delenv("GRPO_TUI_SOCKET", raising=False)
    model, data = setup
    argv = trainer_command(model, tmp_path / "ckpt", data, "--weight-bridge-mode", "lora_restart")
    assert main([*argv[3:], "--sync-every", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: " + MESSAGE.format(mode="lora_restart")]


def test_no_server_within_inference_timeout_exits_2_with_the_reason(
    setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """lora_only hot-loads the starting adapter in ``attach``, after waiting for the
    server's ``/health`` (it may start alongside); no server within the wait is fatal."""
    monkeypatch.delenv("GRPO_TUI_SOCKET", raising=False)
    model, data = setup
    argv = trainer_command(
        model,
        tmp_path / "ckpt",
        data,
        "--weight-bridge-mode",
        "lora_only",
        "--inference-url",
        f"http://127.0.0.1:{free_port()}",
        "--sync-every",
        "1",
        "--inference-timeout",
        "1",
    )
    assert main(argv[3:]) == 2
    err = capsys.readouterr().err.splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and "/health not 200 within 1 s" in errors[0], errors
    assert any("waiting for inference at" in line for line in err), "the wait says so"
    assert not list((tmp_path / "ckpt").glob("step_*")), "no training step ran"


async def test_a_trainer_started_before_its_server_waits_then_attaches_and_trains(
    setup, tmp_path: Path
) -> None:
    """The role layer starts the trainer alongside inference: it loads its model, says it
    waits for the server, and once the (real, built-in) server is up, attaches its adapter
    there and trains; no step runs before."""
    model, data = setup
    settings = InferenceSettings(port=free_port(), max_model_len=64)
    argv = trainer_command(
        model, tmp_path / "ckpt", data, "--weight-bridge-mode", "lora_only", "--sync-every",
        "1", "--training-steps", "1", "--batch-size", "2", "--inference-url", settings.base_url,
    )  # fmt: skip
    trainer = await asyncio.create_subprocess_exec(
        *argv, env=trainer_env(), cwd=REPO, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    launch = inference_command(settings, mode="lora_only", model=str(model))
    server = ServerProcess(launch, settings.base_url, tmp_path / "server.log")
    lines: list[str] = []
    try:
        assert trainer.stderr is not None
        async with asyncio.timeout(120):
            while not any("waiting for inference at" in line for line in lines):
                line = (await trainer.stderr.readline()).decode()
                assert line, f"trainer ended before waiting: {lines}"
                lines.append(line)
        await asyncio.to_thread(server.start)
        async with asyncio.timeout(180):
            rest = await trainer.stderr.read()
            code = await trainer.wait()
        lines += rest.decode().splitlines()
        assert code == 0, lines
        assert any("inference healthy after" in line for line in lines), lines
        models = httpx.get(f"{settings.base_url}/v1/models", timeout=10).json()
        adapters = [m["id"] for m in models["data"] if m.get("parent")]
        assert any(name.startswith("policy-start") for name in adapters), "adapter attached"
    finally:
        server.stop()
        if trainer.returncode is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            await trainer.wait()
