"""Where a role's processes run: one command plus a placement become the argv and env to exec.

A role says *what* to run (the command line of one process, as it runs on one device) and
*where* (a :class:`Placement`: which physical GPUs, how many ranks). A launcher says *how*:
:class:`Local` runs the command as it is; :class:`Torchrun` runs one rank per GPU under
torch's own launcher (``python -m torch.distributed.run``), which forwards signals to every
rank, prefixes each rank's lines and takes the whole group down when one rank fails. A
launcher for other hosts (Slurm's ``srun``) has the same shape; :func:`launcher_for` is the
one place that chooses. Torch-free: ``grpo-tui check`` prints these command lines.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

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
        argv = [
            self.python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(placement.ranks),
            "--max-restarts",
            "0",
            "--tee",
            "3",
            "--log-dir",
            str(self.log_dir),
            "--no-python",
            *command.argv,
        ]
        env = {
            **command.env,
            **placement.env(),
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX,
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(self.shutdown_timeout)),
        }
        return Launch(argv=argv, env=env)


def launcher_for(placement: Placement, *, log_dir: Path, shutdown_timeout: float) -> Launcher:
    """The launcher for a placement: torchrun for several ranks on this host, else local.

    The one place that picks a launcher: an ``srun`` launcher (several hosts, or a Slurm
    allocation) is chosen here too.
    """
    if placement.ranks > 1:
        return Torchrun(log_dir=log_dir, shutdown_timeout=shutdown_timeout)
    return Local()
