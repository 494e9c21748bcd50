"""``[cluster] engine = "slurm"``: the placement plan, its checks and the srun lines as text.

The GPU path (``srun --gpus-per-node``, torchrun across nodes, NCCL between nodes) cannot
run here, so its generated lines are checked as text; the CPU path runs on a real Slurm
cluster in ``tests/e2e/test_e2e_slurm.py``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_tui.cli import app
from grpo_tui.plan.cluster import Allocation
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.supervisor.spec import ProcessSpec

REPO = Path(__file__).resolve().parents[2]
TWO_NODES = REPO / "profiles/qwen2.5-7b-2node.toml"

CPU_TWO_NODES = """\
[run]
mode = "lora_only"
model = "tiny"

[cluster]
engine = "slurm"
nodes = 2

[api]
node = 1

[inference]
node = 1

[trainer]
node = 2
batch_size = 16

[[env]]
node = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(text))
    return path


def check(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["check", str(path)])
    return result.exit_code, result.output


def specs(
    path: Path, tmp_path: Path, allocation: Allocation | None = None
) -> dict[str, ProcessSpec]:
    plan = build_plan(load_profile(path), tmp_path / "run", allocation)
    return {s.name: s for s in plan.specs}


def after(command: list[str], marker: str) -> list[str]:
    return command[command.index(marker) + 1 :]


def test_seven_b_two_node_profile_checks_and_prints_its_placement() -> None:
    code, out = check(TWO_NODES)
    assert code == 0, out
    assert "cluster   slurm, 2 nodes x 8 GPUs" in out
    assert "node 1 node1: supervisor, api, inference 8 GPUs, env  [8/8 GPUs]" in out
    assert "node 2 node2: trainer 8 GPUs  [8/8 GPUs]" in out


def test_seven_b_srun_and_torchrun_lines(tmp_path: Path) -> None:
    plan = specs(TWO_NODES, tmp_path)
    inference, trainer, env = plan["inference"], plan["trainer"], plan["env"]
    head = inference.command[: inference.command.index("--")]
    assert head[0] == "srun"
    assert "--gpus-per-node=8" in head and "--exclusive" in head and "--relative=0" in head
    assert inference.slurm_step == "grpo.run.inference"
    assert "--job-name=grpo.run.inference" in head
    served = after(inference.command, "--")
    assert served[:2] == ["vllm", "serve"] and "--tensor-parallel-size" in served
    assert served[served.index("--host") + 1] == "0.0.0.0"

    head = trainer.command[: trainer.command.index("--")]
    assert not trainer.prestart  # srun and torchrun do not pass the start gate (stdin) on
    assert "--relative=1" in head and "--nodes=1" in head and "--gpus-per-node=8" in head
    torchrun = after(trainer.command, "--")
    assert torchrun[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc-per-node=8" in torchrun and "--rdzv-backend=c10d" in torchrun
    assert "--rdzv-endpoint=node2:29400" in torchrun
    trained = after(torchrun, "--no-python")
    assert trained[1:3] == ["-m", "grpo_trainer.train"]
    assert trained[trained.index("--atropos-url") + 1] == "http://node1:8000"
    assert trained[trained.index("--inference-url") + 1] == "http://node1:9001"
    assert trainer.env["GRPO_WEIGHT_TRANSFER_ADDRESS"] == "node2"
    for variable in (
        "NCCL_NVLS_ENABLE",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST",
        "NVSHMEM_DISABLE_NVLS",
    ):
        assert trainer.env[variable] == inference.env[variable]
    assert "--overlap" in env.command and "--gpus-per-node" not in " ".join(env.command)
    # one run token: the API's and the inference server's, in every role's environment
    token = plan["api"].env["GRPO_API_TOKEN"]
    assert len(token) >= 24
    assert {s.env["VLLM_API_KEY"] for s in plan.values()} == {token}
    assert plan["api"].readiness is not None and "node1:8000" in str(plan["api"].readiness)


def test_trainer_across_two_nodes_meets_at_its_first_node(tmp_path: Path) -> None:
    text = TWO_NODES.read_text().replace("nodes = 2\n", "nodes = 3\n", 1)
    text = text.replace("[trainer]\nnode = 2\n", "[trainer]\nnode = 2\nnodes = 2\n")
    path = write(tmp_path, text)
    allocation = Allocation(
        names=("gpu7", "gpu8", "gpu9"), addresses=("10.0.0.7", "10.0.0.8", "10.0.0.9")
    )
    trainer = specs(path, tmp_path, allocation)["trainer"]
    head = trainer.command[: trainer.command.index("--")]
    assert "--nodes=2" in head and "--ntasks=2" in head and "--ntasks-per-node=1" in head
    torchrun = after(trainer.command, "--")
    assert "--nnodes=2" in torchrun and "--rdzv-endpoint=10.0.0.8:29400" in torchrun
    code, out = check(path)
    assert code == 0, out
    assert "trainer 8 GPUs (node 1 of 2)" in out and "trainer 8 GPUs (node 2 of 2)" in out


def test_cpu_profile_places_roles_and_the_model_build_stays_local(tmp_path: Path) -> None:
    path = write(tmp_path, CPU_TWO_NODES)
    code, out = check(path)
    assert code == 0, out
    assert "node 1 node1: supervisor, model, api, inference" in out
    assert "node 2 node2: trainer, env" in out
    plan = specs(path, tmp_path)
    assert plan["model"].slurm_step is None and plan["model"].command[0] != "srun"
    assert plan["trainer"].command[0] == "srun" and "--overlap" in plan["trainer"].command
    token = plan["api"].env["GRPO_API_TOKEN"]
    assert token not in out, "check printed the run token"


def test_restart_args_and_edits_keep_the_cluster_address_and_token(tmp_path: Path) -> None:
    """A setting changed at a restart or live is validated over the cluster's defaults: the
    servers stay reachable from the other nodes, behind the run token."""
    plan = build_plan(load_profile(write(tmp_path, CPU_TWO_NODES)), tmp_path / "run")
    (tmp_path / "run").mkdir()
    token = plan.roles.spec("api").env["GRPO_API_TOKEN"]
    api = plan.respec("api", {"max_batches_offpolicy": 3})
    inference = plan.respec("inference", {"port": 9123})
    _, edited = plan.edit({"max_batches_offpolicy": 2})
    for spec in (api, inference, edited["api"]):
        host = spec.command[spec.command.index("--host") + 1]
        assert host == "0.0.0.0", spec.name
        assert spec.env["VLLM_API_KEY"] == token
    assert api.env["GRPO_API_TOKEN"] == edited["api"].env["GRPO_API_TOKEN"] == token
    assert plan.roles.spec("trainer").env["GRPO_API_TOKEN"] == token


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        (('[cluster]\nengine = "slurm"\nnodes = 2\n', ""), "api.node", 'engine = "slurm"'),
        (("[trainer]\nnode = 2\n", "[trainer]\nnode = 3\n"), "trainer.node", "allocation has 2"),
        (("[trainer]\nnode = 2\n", "[trainer]\nnode = 2\nnodes = 2\n"), "trainer.nodes", "2..3"),
        (
            ("[trainer]\nnode = 2\n", "[trainer]\nnode = 2\ngpus_per_node = 1\n"),
            "trainer.gpus_per_node",
            "each node has 0",
        ),
        (('[run]\nmode = "lora_only"', '[run]\nmode = "shared_vllm"'), "run.mode", "nccl"),
        (
            ("[inference]\nnode = 1\n", "[inference]\nnode = 1\nnodes = 2\n"),
            "inference.nodes",
            "Ray",
        ),
        (("[api]\nnode = 1\n", '[api]\nnode = 1\nhost = "127.0.0.1"\n'), "api.host", "loopback"),
        (("[cluster]\n", "[cluster]\nnodez = 1\n"), "cluster.nodez", "unknown key"),
    ],
)
def test_plans_that_do_not_fit_exit_2_naming_the_key(
    tmp_path: Path, change: tuple[str, str], key: str, words: str
) -> None:
    text = CPU_TWO_NODES.replace(*change)
    assert text != CPU_TWO_NODES
    code, out = check(write(tmp_path, text))
    assert code == 2, out
    assert "cluster.toml:" in out and f": {key}: " in out and words in out


def test_gpus_per_node_overflow_and_gpu_indices_on_a_cluster(tmp_path: Path) -> None:
    text = TWO_NODES.read_text()
    overflow = text.replace("[trainer]\nnode = 2\n", "[trainer]\nnode = 1\n")
    code, out = check(write(tmp_path, overflow))
    assert code == 2, out
    assert "trainer.gpus_per_node" in out and "node 1 would need 16 GPUs" in out
    pinned = text.replace("[trainer]\nnode = 2\n", "[trainer]\nnode = 2\ngpus = [0, 1]\n")
    code, out = check(write(tmp_path, pinned))
    assert code == 2 and "trainer.gpus" in out and "gpus_per_node" in out, out
    tp = text.replace("tensor_parallel_size = 8", "tensor_parallel_size = 4")
    code, out = check(write(tmp_path, tp))
    assert code == 2 and "inference.gpus_per_node" in out and "= 4" in out, out


def test_run_outside_a_slurm_job_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = CliRunner().invoke(app, ["run", str(write(tmp_path, CPU_TWO_NODES))])
    assert result.exit_code == 2, result.output
    assert "cluster.engine" in result.output and "grpo-tui sbatch" in result.output
