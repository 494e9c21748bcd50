"""A weight sync that cannot start is a configuration problem: exit 2, one line, no traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from train_helpers import make_groups, run_trainer, tiny_model, trainer_command, write_groups

from grpo_trainer.train.__main__ import main


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


MESSAGE = (
    "mode {mode} needs the grpo-tui supervisor: run it under grpo-tui or use "
    "--sync-every 0 (GRPO_TUI_SOCKET is not set)"
)


def test_mode_none_without_supervisor_exits_2_with_one_line(setup, tmp_path: Path) -> None:
    model, data = setup
    command = trainer_command(
        model, tmp_path / "ckpt", data, "--weight-bridge-mode", "none", "--sync-every", "1"
    )
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


def test_sync_error_while_attaching_exits_2_with_the_reason(
    setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """lora_only hot-loads the starting adapter in ``attach``; no server there is fatal."""
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
    )
    assert main(argv[3:]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "load_lora_adapter failed: ConnectError" in errors[0], errors
    assert not list((tmp_path / "ckpt").glob("step_*")), "no training step ran"
