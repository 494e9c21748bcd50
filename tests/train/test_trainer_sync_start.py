"""A weight sync that cannot start is a configuration problem: exit 2, one line, no traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from train_helpers import make_groups, run_trainer, tiny_model, trainer_command, write_groups


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sync-start")
    model = tiny_model(root / "model")
    data = write_groups(root / "groups.jsonl", make_groups(model, count=2, group_size=2, seed=4))
    return model, data


@pytest.mark.parametrize("mode", ["none", "lora_restart"])
def test_restart_mode_without_supervisor_exits_2_with_one_line(
    setup, tmp_path: Path, mode: str
) -> None:
    model, data = setup
    command = trainer_command(
        model, tmp_path / "ckpt", data, "--weight-bridge-mode", mode, "--sync-every", "1"
    )
    result = run_trainer(command, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: mode {mode} needs the grpo-tui supervisor: run it under grpo-tui or use "
        "--sync-every 0 (GRPO_TUI_SOCKET is not set)"
    ]
    assert not (tmp_path / "ckpt").exists(), "nothing is written before the check"


def test_sync_error_while_attaching_exits_2_with_the_reason(setup, tmp_path: Path) -> None:
    """lora_only hot-loads the starting adapter in ``attach``; no server there is fatal."""
    model, data = setup
    command = trainer_command(
        model,
        tmp_path / "ckpt",
        data,
        "--weight-bridge-mode",
        "lora_only",
        "--inference-url",
        f"http://127.0.0.1:{free_port()}",
        "--sync-every",
        "1",
    )
    result = run_trainer(command, timeout=90)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "load_lora_adapter failed: ConnectError" in errors[0], errors
    assert not list((tmp_path / "ckpt").glob("step_*")), "no training step ran"
