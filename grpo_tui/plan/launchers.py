"""Where a role's processes run: one command plus a placement become the argv and env to exec.

A role says *what* to run (the command line of one process, as it runs on one device) and
*where* (a :class:`Placement`: which physical GPUs, how many ranks). A launcher says *how*:
:class:`Local` runs the command as it is; :class:`Torchrun` runs one rank per GPU under
torch's own launcher (``python -m torch.distributed.run``), which forwards signals to every
rank, prefixes each rank's lines and takes the whole group down when one rank fails. A
launcher for other hosts has the same shape: :class:`Srun` runs a command as one Slurm job
step on some nodes of the allocation, :class:`TorchrunNodes` a torchrun group spanning
nodes; :func:`launcher_for` chooses for one host, the role layer adds ``Srun`` on a
cluster. Torch-free: ``grpo-tui check`` prints these command lines.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from grpo_tui.plan.cluster import NodePlacement

GPU_ENV: dict[str, str] = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Environment of every process we start on a GPU.

``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number GPUs as NVML and ``nvidia-smi`` do, so a
profile's ``gpus = [2, 3]`` and the dashboard's GPU rows name the same devices. The other
three keep NVLink multicast (NVLS) off: the GPU hosts we run on do not support it.
"""

RANK_PREFIX = "[rank${rank}] "
"""torchrun's log-line prefix template: every line of the group's output names its rank."""


class Launch(BaseModel):
    """A resolved command: the argv to exec and the environment variables to add."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str]
    env: dict[str, str] = {}


@dataclass(frozen=True)
class Placement:
    """Where one role runs: physical GPU indices (empty: not pinned), ranks, GPU or not.

    ``ranks`` is the number of processes the launcher starts (one per GPU for a sharded
    trainer); a role that spreads over its GPUs itself (vLLM's tensor and data parallel
    workers) is one rank holding several GPUs.
    """

    gpus: tuple[int, ...] = ()
    ranks: int = 1
    on_gpu: bool = False

    def env(self) -> dict[str, str]:
        """The placement's environment: nothing off the GPU, else ``GPU_ENV`` and the GPUs."""
        if not self.on_gpu:
            return {}
        env = dict(GPU_ENV)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in self.gpus)
        return env


class Launcher(Protocol):
    """Turns one process's command into what actually runs at a placement."""

    def wrap(self, command: Launch, placement: Placement) -> Launch: ...


@dataclass(frozen=True)
class Local:
    """The command itself, on this host, with the placement's environment."""

    def wrap(self, command: Launch, placement: Placement) -> Launch:
        return Launch(argv=command.argv, env={**command.env, **placement.env()})


@dataclass(frozen=True)
class Torchrun:
    """One rank per GPU on this host under ``torchrun --standalone``.

    ``--max-restarts 0``: a failed rank ends the group and torchrun exits non-zero, so the
    supervisor's restart policy (resume from the last checkpoint) is the one restart loop.
    ``--tee 3`` with ``RANK_PREFIX`` shows every rank's output, prefixed, on torchrun's own
    output (the supervisor's log pane) and keeps per-rank files under ``log_dir``.
    ``--no-python`` runs the command line unchanged in each rank. torchrun gives the ranks
    ``shutdown_timeout`` seconds after it forwards a SIGTERM before it kills them: the
    role's own shutdown timeout, so that every rank can finish its step and checkpoint.
    """

    log_dir: Path
    shutdown_timeout: float
    python: str = sys.executable

    def wrap(self, command: Launch, placement: Placement) -> Launch:
        rendezvous = ["--standalone", "--nproc-per-node", str(placement.ranks)]
        return torchrun_launch(self, rendezvous, command, placement)


def launcher_for(placement: Placement, *, log_dir: Path, shutdown_timeout: float) -> Launcher:
    """The launcher for a placement: torchrun for several ranks on this host, else local.

    The one place that picks a launcher: an ``srun`` launcher (several hosts, or a Slurm
    allocation) is chosen here too.
    """
    if placement.ranks > 1:
        return Torchrun(log_dir=log_dir, shutdown_timeout=shutdown_timeout)
    return Local()


def step_name(run_name: str, process: str) -> str:
    """The Slurm job-step name of ``process`` in run directory ``run_name``: unique per run,
    which is how the supervisor and its watchdog find their own steps (and only those)."""
    return f"grpo.{run_name}.{process}"


@dataclass(frozen=True)
class Srun:
    """The command as one Slurm job step on ``place``'s nodes of the current allocation.

    Run by the supervisor on the allocation's first node, ``srun`` is supervised like any
    local child: it relays every task's output, its exit is the step's. ``--relative``
    picks the nodes inside the allocation (no host names in the line). A step with GPUs
    takes them ``--exclusive``ly (Slurm sets ``CUDA_VISIBLE_DEVICES``); a CPU-only step
    runs ``--overlap`` with the others on its node. Every count is explicit: the batch
    script's ``SLURM_NTASKS`` and such would otherwise apply. ``--kill-on-bad-exit`` ends
    every task of the step when one fails (a torchrun agent dying on one node). A stop
    reaches the tasks as ``scancel --signal`` (see ``grpo_tui.supervisor.steps``).
    """

    step: str
    place: NodePlacement
    extra: tuple[str, ...] = ()

    def wrap(self, command: Launch, placement: Placement) -> Launch:
        argv = [
            "srun",
            f"--job-name={self.step}",
            f"--nodes={self.place.nodes}",
            f"--ntasks={self.place.nodes}",
            "--ntasks-per-node=1",
            f"--relative={self.place.node - 1}",
            "--kill-on-bad-exit=1",
        ]
        env = dict(command.env)
        if self.place.gpus_per_node:
            argv += [f"--gpus-per-node={self.place.gpus_per_node}", "--exclusive"]
            env.update(GPU_ENV)
        else:
            argv.append("--overlap")
        return Launch(argv=[*argv, *self.extra, "--", *command.argv], env=env)


@dataclass(frozen=True)
class TorchrunNodes:
    """One rank per GPU on each of ``nodes`` nodes: torchrun with a c10d rendezvous.

    Runs once per node (as an ``Srun`` step); the agents meet at ``endpoint`` (``host:port``
    on the first node of the step) and ``--rdzv-id`` keeps two runs apart. Otherwise as
    :class:`Torchrun`: no restarts of its own, prefixed rank output, the role's shutdown
    timeout for the ranks.
    """

    nodes: int
    endpoint: str
    rdzv_id: str
    log_dir: Path
    shutdown_timeout: float
    python: str = sys.executable

    def wrap(self, command: Launch, placement: Placement) -> Launch:
        rendezvous = [
            f"--nnodes={self.nodes}",
            f"--nproc-per-node={placement.ranks}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.rdzv_id}",
        ]
        return torchrun_launch(self, rendezvous, command, placement)


def torchrun_launch(
    launcher: Torchrun | TorchrunNodes,
    rendezvous: list[str],
    command: Launch,
    placement: Placement,
) -> Launch:
    """``torchrun RENDEZVOUS ... --no-python COMMAND``: what both torchrun launchers share
    (no restarts of its own, prefixed rank output, per-rank logs, the shutdown timeout)."""
    argv = [
        launcher.python,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        "--max-restarts",
        "0",
        "--tee",
        "3",
        "--log-dir",
        str(launcher.log_dir),
        "--no-python",
        *command.argv,
    ]
    env = {
        **command.env,
        **placement.env(),
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX,
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(launcher.shutdown_timeout)),
    }
    return Launch(argv=argv, env=env)
