"""GPU keys: ``[trainer] gpus``, ``[inference] gpus`` / tensor and data parallel sizes.

Each bad layout exits 2 from ``grpo-tui check`` naming the file and the key; good layouts
give the launch lines: torchrun for a trainer on several GPUs, vLLM's parallel flags, and
CUDA_VISIBLE_DEVICES plus the NVLink-multicast-off variables on every GPU process.
"""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_trainer.train.config import TrainerConfig
from grpo_tui.cli import app
from grpo_tui.plan.launchers import GPU_ENV
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.supervisor.spec import ProcessSpec

REPO = Path(__file__).resolve().parents[2]
SEVEN_B = REPO / "profiles/qwen2.5-7b-8gpu.toml"
SEVEN_B_4GPU = REPO / "profiles/qwen2.5-7b-4gpu.toml"


def write(tmp_path: Path, inference: str, trainer: str, mode: str = "none") -> Path:
    path = tmp_path / "gpus.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [run]
            mode = "{mode}"
            model = "org/model"

            [api]

            [inference]
            backend = "vllm"
            {inference}

            [trainer]
            {trainer}
            """
        )
    )
    return path


def check(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["check", str(path), "--profile-only"])
    return result.exit_code, result.output


def specs(path: Path, tmp_path: Path) -> dict[str, ProcessSpec]:
    return {s.name: s for s in build_plan(load_profile(path), tmp_path / "run").specs}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


BAD = [
    # (inference table, trainer table, mode, key named, words in the message)
    ("gpus = [2, 2]", "gpus = [0]", "none", "inference.gpus", "distinct"),
    ("gpus = [2]", "gpus = [0, -1]", "none", "trainer.gpus[1]", "greater than or equal to 0"),
    ("gpus = []", "gpus = [0]", "none", "inference.gpus", "one or more"),
    ("gpus = [1, 2]", "gpus = [0, 1]", "none", "inference.gpus", "[1] are also in trainer.gpus"),
    ("gpus = [1, 2]", "gpus = [1]", "none", "inference.gpus", "GPUs of the trainer's alone"),
    ("gpus = [1]", "gpus = [0, 1]", "none", "inference.gpu_memory_utilization", "0.9"),
    (
        "gpus = [0]\ngpu_memory_utilization = 0.3\nweight_transfer = 'nccl'",
        "gpus = [0, 1]",
        "shared_vllm",
        "inference.weight_transfer",
        "off GPU 0, where trainer rank 0",
    ),
    ("gpus = [2, 3, 4]\ntensor_parallel_size = 2", "gpus = [0]", "none", "inference.gpus", "= 2"),
    ("tensor_parallel_size = 2", "device = 'cuda'", "none", "inference.gpus", "is required"),
    ("gpus = [1]", "device = 'cuda'", "none", "trainer.gpus", "is required"),
    ("gpu_memory_utilization = 0.5", "gpus = [0]", "none", "inference.gpus", "is required"),
    ("gpus = [1]", "gpus = [0]\ndevice = 'cpu'", "none", "trainer.device", "leave device out"),
    ("gpus = [1]", "gpus = [0, 1]\ndevice = 'cuda:1'", "none", "trainer.device", "'cuda:1'"),
    ("gpus = [0]", "gpus = [0]", "none", "inference.gpu_memory_utilization", "0.9"),
    (
        "gpus = [1]\nweight_transfer = 'cuda_ipc'",
        "gpus = [0]",
        "shared_vllm",
        "inference.weight_transfer",
        "weight_transfer = 'nccl'",
    ),
    (
        "gpus = [1, 2]\ntensor_parallel_size = 2",
        "gpus = [0]",
        "shared_vllm",
        "inference.weight_transfer",
        "one and the same GPU",
    ),
    (
        "gpus = [0]\ngpu_memory_utilization = 0.4\nweight_transfer = 'nccl'",
        "gpus = [0]",
        "shared_vllm",
        "inference.weight_transfer",
        "use weight_transfer = 'cuda_ipc'",
    ),
    ("cuda_visible_devices = '1'", "gpus = [0]", "none", "inference", "gpus = [0, 1]"),
    ("gpus = [1]", "gpus = [0]", "colocate", "inference.gpus", "list trainer.gpus [0]"),
    (
        "gpus = [3]",
        "gpus = [0, 1, 2]\nbatch_size = 2\ngradient_accumulation_steps = 2",
        "none",
        "trainer.gpus",
        "3 ranks do not split a step of 4 sequences",
    ),
    (
        "gpus = [0, 1]\ntensor_parallel_size = 2\ngpu_memory_utilization = 0.4",
        "gpus = [1, 0]",
        "colocate",
        "inference.gpus",
        "the trainer's own GPUs",
    ),
    (  # colocate on N GPUs: one whole vLLM replica per trainer GPU
        "gpus = [0, 1]\ntensor_parallel_size = 2\ngpu_memory_utilization = 0.4",
        "gpus = [0, 1]",
        "colocate",
        "inference.tensor_parallel_size",
        "set tensor_parallel_size = 1",
    ),
    (
        "gpus = [0, 1]\ntensor_parallel_size = 2\ngpu_memory_utilization = 0.4",
        "gpus = [0, 1]",
        "colocate",
        "inference.data_parallel_size",
        "set data_parallel_size = 2 (the trainer's 2 ranks)",
    ),
    (
        "gpus = [0, 1]\ndata_parallel_size = 2\ngpu_memory_utilization = 0.4",
        "gpus = [0, 1]\nranks = 2",
        "colocate",
        "trainer.ranks",
        "trainer.gpus already runs one rank per GPU",
    ),
]


@pytest.mark.parametrize(("inference", "trainer", "mode", "key", "words"), BAD)
def test_bad_gpu_layout_names_file_and_key(
    tmp_path: Path, inference: str, trainer: str, mode: str, key: str, words: str
) -> None:
    path = write(tmp_path, inference, trainer, mode)
    code, output = check(path)
    assert code == 2, output
    line = next((ln for ln in output.splitlines() if f": {key}: " in ln and words in ln), None)
    assert line is not None, output
    assert line.startswith(f"error {path}:")


def test_builtin_backend_serves_on_one_gpu(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus = [1, 2]\ndata_parallel_size = 2", "gpus = [0]")
    path.write_text(path.read_text().replace('backend = "vllm"', 'backend = "builtin"'))
    code, output = check(path)
    assert code == 2
    assert "inference.gpus: lists 2 GPUs, but the built-in backend serves on one GPU" in output
    assert "inference.data_parallel_size: is a vLLM setting" in output
    path.write_text(path.read_text().replace("gpus = [1, 2]", "gpus = [1]\ndevice = 'cpu'"))
    code, output = check(path)
    assert code == 2
    assert "inference.device: is 'cpu', but inference.gpus runs the server on GPU 1" in output


def test_no_gpus_key_keeps_todays_single_process_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "", "device = 'cuda'")
    found = specs(path, tmp_path)
    trainer, inference = found["trainer"], found["inference"]
    assert trainer.command[1:3] == ["-m", "grpo_trainer.train"]
    assert flag(trainer.command, "--device") == "cuda"
    assert "CUDA_VISIBLE_DEVICES" not in trainer.env
    assert "CUDA_VISIBLE_DEVICES" not in inference.env
    # on a GPU, with or without gpus, multicast stays off
    for spec in (trainer, inference):
        assert {k: spec.env[k] for k in GPU_ENV} == GPU_ENV
    assert "--tensor-parallel-size" not in inference.command
    cpu = specs(REPO / "profiles/quickstart.toml", tmp_path)
    assert all(not set(GPU_ENV) & set(spec.env) for spec in cpu.values())


def test_one_gpu_each_runs_local_with_cuda_visible_devices(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus = [3]", "gpus = [5]")
    found = specs(path, tmp_path)
    trainer, inference = found["trainer"], found["inference"]
    assert trainer.command[:3] == [sys.executable, "-m", "grpo_trainer.train"]
    assert flag(trainer.command, "--device") == "cuda"
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "5"
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert trainer.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_two_rank_trainer_may_host_vllm_on_its_second_gpu(tmp_path: Path) -> None:
    inference = "gpus = [1]\ngpu_memory_utilization = 0.3\nweight_transfer = 'nccl'"
    path = write(tmp_path, inference, "gpus = [0, 1]", "shared_vllm")
    code, output = check(path)
    assert code == 0, output
    found = specs(path, tmp_path)
    assert found["trainer"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert found["inference"].env["CUDA_VISIBLE_DEVICES"] == "1"


def test_builtin_server_on_a_listed_gpu_runs_on_cuda(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus = [1]", "gpus = [0]")
    path.write_text(path.read_text().replace('backend = "vllm"', 'backend = "builtin"'))
    inference = specs(path, tmp_path)["inference"]
    assert flag(inference.command, "--device") == "cuda"
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "1"


def test_seven_b_profile_launch_lines(tmp_path: Path) -> None:
    run = tmp_path / "run"
    found = {s.name: s for s in build_plan(load_profile(SEVEN_B), run).specs}
    trainer, inference = found["trainer"], found["inference"]
    command = trainer.command
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    assert command[:4] == head
    assert not trainer.prestart  # torchrun's ranks do not read its stdin (the start gate)
    assert flag(command, "--nproc-per-node") == "4"
    assert flag(command, "--max-restarts") == "0"
    assert flag(command, "--tee") == "3"
    assert flag(command, "--log-dir") == str(run / "logs" / "trainer-ranks")
    rank_command = command[command.index("--no-python") + 1 :]
    assert rank_command[:3] == [sys.executable, "-m", "grpo_trainer.train"]
    assert flag(rank_command, "--device") == "cuda"
    assert flag(rank_command, "--weight-bridge-mode") == "shared_vllm"
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert trainer.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}] "
    assert trainer.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(int(trainer.shutdown.timeout))
    assert inference.command[:2] == ["vllm", "serve"]
    assert flag(inference.command, "--tensor-parallel-size") == "4"
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    for spec in (trainer, inference):
        assert {k: spec.env[k] for k in GPU_ENV} == GPU_ENV


def test_seven_b_on_four_gpus_three_ranks_and_vllm_on_the_fourth(tmp_path: Path) -> None:
    """Issue 29's node: FSDP2 on GPUs 0-2, vLLM alone on GPU 3, weights over NCCL, the
    Qwen2.5-7B decoder built on the machine, a step that 3 ranks split evenly."""
    found = {s.name: s for s in build_plan(load_profile(SEVEN_B_4GPU), tmp_path / "run").specs}
    trainer, inference, model = found["trainer"], found["inference"], found["model"]
    assert flag(trainer.command, "--nproc-per-node") == "3"
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "3"
    assert "--tensor-parallel-size" not in inference.command
    assert flag(inference.command, "--weight-transfer-config") == '{"backend": "nccl"}'
    rank = trainer.command[trainer.command.index("--no-python") + 1 :]
    step = int(flag(rank, "--batch-size")) * int(flag(rank, "--gradient-accumulation-steps"))
    assert step % 3 == 0 and step % int(flag(rank, "--group-size")) == 0
    assert "--gradient-checkpointing" in rank and "--cpu-offload" not in rank
    shape = {k: flag(model.command, f"--{k}") for k in ("hidden-size", "num-layers", "num-heads")}
    assert shape == {"hidden-size": "3584", "num-layers": "28", "num-heads": "28"}
    assert (flag(model.command, "--num-kv-heads"), flag(model.command, "--intermediate-size")) \
        == ("4", "18944")  # fmt: skip
    code, output = check(SEVEN_B_4GPU)
    assert code == 0, output
    assert "gpus      trainer [0, 1, 2] (3 ranks, torchrun); inference [3]" in output


def test_check_prints_who_holds_which_gpu_and_quoted_env() -> None:
    code, output = check(SEVEN_B)
    assert code == 0, output
    assert "gpus      trainer [0, 1, 2, 3] (4 ranks, torchrun); inference [4, 5, 6, 7]" in output
    env_line = next(ln for ln in output.splitlines() if "TORCHELASTIC_LOG_LINE" in ln)
    words = dict(w.split("=", 1) for w in shlex.split(env_line.split(":", 1)[1]))
    assert words["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank}] "
    assert words["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_mode_switch_into_a_layout_the_mode_cannot_use_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus = [1]\nweight_transfer = 'cuda_ipc'", "gpus = [0]")
    plan = build_plan(load_profile(path), tmp_path / "run")
    with pytest.raises(ValueError, match=r"inference\.weight_transfer"):
        plan.respec("trainer", {"mode": "shared_vllm"})
    assert plan.roles.mode == "none"


def test_colocate_on_the_trainers_gpus_checks(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus = [0]\ngpu_memory_utilization = 0.4", "gpus = [0]", "colocate")
    code, output = check(path)
    assert code == 0, output
    assert "gpus      trainer [0]; inference [0]" in output


def test_colocate_on_two_gpus_runs_two_ranks_beside_two_vllm_replicas(tmp_path: Path) -> None:
    inference = "gpus = [0, 1]\ndata_parallel_size = 2\ngpu_memory_utilization = 0.4"
    path = write(tmp_path, inference, "gpus = [0, 1]", "colocate")
    code, output = check(path)
    assert code == 0, output
    assert "trainer [0, 1] (2 ranks, torchrun); inference [0, 1] (vLLM " in output
    found = specs(path, tmp_path)
    trainer, served = found["trainer"], found["inference"]
    assert flag(trainer.command, "--nproc-per-node") == "2"
    assert flag(trainer.command, "--weight-bridge-mode") == "colocate"
    assert flag(served.command, "--data-parallel-size") == "2"
    assert "--tensor-parallel-size" not in served.command
    assert "--enable-sleep-mode" in served.command
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == served.env["CUDA_VISIBLE_DEVICES"] == "0,1"


def quickstart(tmp_path: Path, mode: str, trainer: str, inference: str) -> Path:
    text = (REPO / "profiles/quickstart.toml").read_text()
    text = text.replace('mode = "shared_vllm"', f'mode = "{mode}"')
    text = text.replace("[trainer]\n", f"[trainer]\n{trainer}\n")
    text = text.replace("[inference]\n", f"[inference]\n{inference}\n")
    path = tmp_path / "cpu.toml"
    path.write_text(text)
    return path


def test_colocate_on_cpu_ranks_runs_one_builtin_replica_per_rank(tmp_path: Path) -> None:
    path = quickstart(tmp_path, "colocate", "ranks = 2", "data_parallel_size = 2")
    code, output = check(path)
    assert code == 0, output
    found = specs(path, tmp_path)
    trainer, served = found["trainer"], found["inference"]
    assert flag(trainer.command, "--nproc-per-node") == "2"
    rank_command = trainer.command[trainer.command.index("--no-python") + 1 :]
    config = TrainerConfig.from_argv(rank_command[3:])
    assert (config.device, config.weight_bridge_mode, config.sync_every) == ("cpu", "colocate", 1)
    assert not set(GPU_ENV) & set(trainer.env)
    assert flag(served.command, "--data-parallel-size") == "2"
    assert "--shared-weights" not in served.command  # each replica loads its rank's weights


@pytest.mark.parametrize(
    ("mode", "trainer", "inference", "key", "words"),
    [
        ("colocate", "ranks = 2", "", "inference.data_parallel_size", "data_parallel_size = 2"),
        ("colocate", "ranks = 3", "data_parallel_size = 2", "inference.data_parallel_size", "3"),
        ("shared_vllm", "ranks = 2", "data_parallel_size = 2", "inference.data_parallel_size",
         "only on CPU in colocate"),
        ("colocate", "ranks = 0", "", "trainer.ranks", "greater than or equal to 1"),
    ],
)  # fmt: skip
def test_bad_cpu_rank_layouts_name_their_key(
    tmp_path: Path, mode: str, trainer: str, inference: str, key: str, words: str
) -> None:
    path = quickstart(tmp_path, mode, trainer, inference)
    code, output = check(path)
    assert code == 2, output
    assert any(f": {key}: " in line and words in line for line in output.splitlines()), output


def test_cpu_ranks_on_a_gpu_device_point_to_gpus(tmp_path: Path) -> None:
    code, output = check(write(tmp_path, "", "ranks = 2\ndevice = 'cuda'"))
    assert code == 2, output
    assert "trainer.ranks: runs 2 CPU ranks, but trainer.device is 'cuda'" in output
