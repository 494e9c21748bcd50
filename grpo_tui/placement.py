"""Which GPUs each role holds: the profile's ``gpus`` keys, checked across roles.

``[trainer] gpus = [0, 1]`` runs the trainer on those GPUs, one rank each (torchrun when
there are several); ``[inference] gpus = [2, 3]`` is the inference server's
``CUDA_VISIBLE_DEVICES``, which vLLM spreads over with ``tensor_parallel_size`` x
``data_parallel_size``. Without ``gpus`` a role runs as it always did (``device`` says
where). This module finds every placement problem a profile can have, each naming its key,
and turns the keys into one :class:`~grpo_tui.launchers.Placement` per role. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from grpo_trainer.serve.settings import GpuIndices, InferenceSettings
from grpo_tui.launchers import Placement
from grpo_tui.profile import Problem, Profile

GPUS = TypeAdapter(GpuIndices)
Report = Callable[[tuple[str, ...], str], None]


def _gpu_list(gpus: tuple[int, ...]) -> str:
    return f"[{', '.join(str(gpu) for gpu in gpus)}]"


def may_share(mode: str, trainer: tuple[int, ...], inference: tuple[int, ...]) -> bool:
    """True when the trainer and inference may hold these GPUs together in ``mode``.

    One GPU shared by both is today's single-GPU layout (vLLM's ``gpu_memory_utilization``
    leaves the trainer its part; ``shared_vllm`` over CUDA IPC needs exactly that). A
    multi-GPU trainer may host vLLM on some or all of its GPUs too (a machine with fewer
    GPUs than roles), again with ``gpu_memory_utilization`` set; vLLM on GPUs the trainer
    does not have besides is refused (an unplanned half-shared layout).
    """
    if len(trainer) == 1:
        return trainer == inference
    return set(inference) <= set(trainer)


@dataclass
class GpuPlan:
    """The checked placement of every role, plus the problems found on the way."""

    placements: dict[str, Placement] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def holders(self) -> dict[int, list[str]]:
        """``physical GPU index -> roles pinned to it``, for the plan and the dashboard."""
        held: dict[int, list[str]] = {}
        for role, placement in self.placements.items():
            for gpu in placement.gpus:
                held.setdefault(gpu, []).append(role)
        return dict(sorted(held.items()))


def trainer_gpus(
    profile: Profile, table: Mapping[str, Any]
) -> tuple[tuple[int, ...], list[Problem]]:
    """The ``[trainer] gpus`` list (empty when absent) and its problems."""
    if "gpus" not in table:
        return (), []
    try:
        return tuple(GPUS.validate_python(table["gpus"])), []
    except ValidationError as error:
        return (), profile.validation_problems(error, ("trainer", "gpus"))


def plan_gpus(
    profile: Profile,
    *,
    mode: str,
    trainer: tuple[int, ...] | None,
    trainer_device: str,
    inference: InferenceSettings | None,
) -> GpuPlan:
    """Check the roles' GPU keys together; ``None`` for a role the profile does not run.

    ``trainer_device`` is the device the trainer's table asks for (``cuda`` when it lists
    ``gpus``); ``inference`` the validated ``[inference]`` settings.
    """
    plan = GpuPlan()

    def problem(path: tuple[str, ...], message: str) -> None:
        plan.problems.append(profile.problem(path, message))

    if trainer is not None:
        if trainer and trainer_device != "cuda":
            problem(
                ("trainer", "device"),
                f"is {trainer_device!r}, but trainer.gpus runs the trainer on GPUs "
                f"{_gpu_list(trainer)}: leave device out (or set it to 'cuda')",
            )
        plan.placements["trainer"] = Placement(
            gpus=trainer,
            ranks=max(1, len(trainer)),
            on_gpu=bool(trainer) or trainer_device.startswith("cuda"),
        )
    if inference is not None:
        _check_inference(inference, problem)
        gpus = tuple(inference.gpus or ())
        on_gpu = bool(gpus) or inference.backend != "builtin" or inference.device.startswith("cuda")
        plan.placements["inference"] = Placement(gpus=gpus, on_gpu=on_gpu)
    if trainer is not None and inference is not None:
        _check_together(mode, inference, plan.placements, problem)
    return plan


def _check_inference(settings: InferenceSettings, problem: Report) -> None:
    gpus = tuple(settings.gpus or ())
    tp, dp = settings.tensor_parallel_size, settings.data_parallel_size
    if settings.backend == "builtin":
        if len(gpus) > 1:
            problem(
                ("inference", "gpus"),
                f"lists {len(gpus)} GPUs, but the built-in backend serves on one GPU: "
                "list one, or use backend = 'vllm'",
            )
        for key, size in (("tensor_parallel_size", tp), ("data_parallel_size", dp)):
            if size > 1:
                problem(("inference", key), "is a vLLM setting: the built-in backend serves alone")
        if gpus and settings.device != "cuda":
            problem(
                ("inference", "device"),
                f"is {settings.device!r}, but inference.gpus runs the server on GPU "
                f"{gpus[0]}: leave device out (or set it to 'cuda')",
            )
        return
    if gpus and len(gpus) != tp * dp:
        problem(
            ("inference", "gpus"),
            f"lists {len(gpus)} GPUs, but tensor_parallel_size {tp} x data_parallel_size {dp} "
            f"= {tp * dp}: vLLM needs one GPU per worker",
        )
    elif not gpus and tp * dp > 1:
        problem(
            ("inference", "gpus"),
            f"is required with tensor_parallel_size {tp} x data_parallel_size {dp}: list the "
            f"{tp * dp} GPUs vLLM runs on",
        )


def _check_together(
    mode: str, inference: InferenceSettings, placements: Mapping[str, Placement], problem: Report
) -> None:
    trainer, served = placements["trainer"], placements["inference"]
    if trainer.gpus and served.on_gpu and not served.gpus:
        problem(
            ("inference", "gpus"),
            f"is required: trainer.gpus is {_gpu_list(trainer.gpus)}, so say which GPUs "
            "inference runs on (unpinned, it would take GPU 0)",
        )
    if served.gpus and trainer.on_gpu and not trainer.gpus:
        problem(
            ("trainer", "gpus"),
            f"is required: inference.gpus is {_gpu_list(served.gpus)}, so say which GPUs the "
            "trainer runs on",
        )
    if mode == "colocate" and trainer.gpus and served.gpus and trainer.gpus != served.gpus:
        problem(
            ("inference", "gpus"),
            f"is {_gpu_list(served.gpus)}, but colocate runs inference on the trainer's own "
            f"GPUs (it sleeps while the trainer steps): list trainer.gpus "
            f"{_gpu_list(trainer.gpus)}",
        )
        return
    shared = sorted(set(trainer.gpus) & set(served.gpus))
    if shared and not may_share(mode, trainer.gpus, served.gpus):
        problem(
            ("inference", "gpus"),
            f"GPU(s) {_gpu_list(tuple(shared))} are also in trainer.gpus: the trainer and "
            "inference share GPUs only where vLLM runs on GPUs of the trainer's alone "
            "(a single shared GPU, or some of a multi-GPU trainer's)",
        )
    elif shared and inference.backend != "builtin" and inference.gpu_memory_utilization is None:
        problem(
            ("inference", "gpu_memory_utilization"),
            f"is required when {inference.backend} shares GPU {shared[0]} with the trainer "
            "(it would take ~0.9 of its memory): e.g. 0.45",
        )
    if mode == "colocate":
        _check_colocate(trainer, served, problem)
    if mode != "shared_vllm" or inference.backend != "vllm":
        return
    if inference.weight_transfer == "cuda_ipc":
        one_gpu = len(served.gpus) <= 1 and trainer.ranks == 1
        if not one_gpu or (trainer.gpus and served.gpus and trainer.gpus != served.gpus):
            problem(
                ("inference", "weight_transfer"),
                "is 'cuda_ipc', which needs the trainer and vLLM on one and the same GPU "
                f"(trainer.gpus {_gpu_list(trainer.gpus)}, inference.gpus "
                f"{_gpu_list(served.gpus)}): set weight_transfer = 'nccl' for the trainer "
                "on other GPUs",
            )
    elif trainer.gpus and trainer.gpus[0] in served.gpus:
        problem(
            ("inference", "weight_transfer"),
            f"is 'nccl', which needs vLLM off GPU {trainer.gpus[0]}, where trainer rank 0 "
            "sends the weights (NCCL puts no two ranks of a group on one GPU): "
            + (
                "on one GPU use weight_transfer = 'cuda_ipc'"
                if len(trainer.gpus) == 1
                else "list the trainer's other GPUs first or move vLLM"
            ),
        )


def _check_colocate(trainer: Placement, served: Placement, problem: Report) -> None:
    """``colocate`` time-shares one device: inference on the trainer's own GPU.

    N GPUs (FSDP2 ranks, one vLLM replica beside each) is not built yet.
    """
    if trainer.ranks > 1 or len(served.gpus) > 1:
        problem(
            ("trainer", "gpus"),
            f"lists {len(trainer.gpus)} GPUs with inference.gpus {_gpu_list(served.gpus)}: "
            "colocate runs the trainer and inference on one and the same GPU for now",
        )
    elif trainer.gpus and served.gpus and trainer.gpus != served.gpus:
        problem(
            ("inference", "gpus"),
            f"is {_gpu_list(served.gpus)} but trainer.gpus is {_gpu_list(trainer.gpus)}: "
            "colocate time-shares one GPU, so list the trainer's",
        )
