"""Which GPUs each role holds: the profile's ``gpus`` keys, checked across roles.

``[trainer] gpus = [0, 1]`` runs the trainer on those GPUs, one rank each (torchrun when
there are several); ``[inference] gpus = [2, 3]`` is the inference server's
``CUDA_VISIBLE_DEVICES``, which vLLM spreads over with ``tensor_parallel_size`` x
``data_parallel_size``. Without ``gpus`` a role runs as it always did (``device`` says
where). This module finds every placement problem a profile can have, each naming its key,
and turns the keys into one :class:`~grpo_tui.plan.launchers.Placement` per role. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from grpo_trainer.serve.settings import GpuIndices, InferenceSettings
from grpo_tui.plan.launchers import Placement
from grpo_tui.plan.profile import Problem, Profile

GPUS = TypeAdapter(GpuIndices)
RANKS = TypeAdapter(Annotated[int, Field(ge=1, strict=True)])
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


def trainer_ranks(
    profile: Profile, table: Mapping[str, Any], gpus: tuple[int, ...]
) -> tuple[int, list[Problem]]:
    """How many trainer processes run: ``len(gpus)``, or ``[trainer] ranks`` on CPU.

    ``ranks = N`` runs N CPU ranks under torchrun (gloo): a sharded trainer without GPUs,
    for CI and for trying a multi-rank layout on a laptop. On GPUs the list says it.
    """
    if "ranks" not in table:
        return max(1, len(gpus)), []
    try:
        ranks = RANKS.validate_python(table["ranks"])
    except ValidationError as error:
        return max(1, len(gpus)), profile.validation_problems(error, ("trainer", "ranks"))
    if gpus:
        message = f"is {ranks}, but trainer.gpus already runs one rank per GPU: leave ranks out"
        return len(gpus), [profile.problem(("trainer", "ranks"), message)]
    if ranks > 1 and table.get("device", "cpu") != "cpu":
        message = (
            f"runs {ranks} CPU ranks, but trainer.device is {table['device']!r}: on GPUs "
            "list them in trainer.gpus"
        )
        return ranks, [profile.problem(("trainer", "ranks"), message)]
    return ranks, []


def plan_gpus(
    profile: Profile,
    *,
    mode: str,
    trainer: tuple[int, ...] | None,
    trainer_device: str,
    inference: InferenceSettings | None,
    ranks: int = 1,
) -> GpuPlan:
    """Check the roles' GPU keys together; ``None`` for a role the profile does not run.

    ``trainer_device`` is the device the trainer's table asks for (``cuda`` when it lists
    ``gpus``); ``ranks`` its process count (``trainer_ranks``); ``inference`` the
    validated ``[inference]`` settings.
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
            ranks=max(ranks, len(trainer)),
            on_gpu=bool(trainer) or trainer_device.startswith("cuda"),
        )
    if inference is not None:
        _check_inference(inference, mode, problem)
        gpus = tuple(inference.gpus or ())
        on_gpu = bool(gpus) or inference.backend != "builtin" or inference.device.startswith("cuda")
        plan.placements["inference"] = Placement(gpus=gpus, on_gpu=on_gpu)
    if trainer is not None and inference is not None:
        _check_together(mode, inference, plan.placements, problem)
    return plan


def _check_inference(settings: InferenceSettings, mode: str, problem: Report) -> None:
    gpus = tuple(settings.gpus or ())
    tp, dp = settings.tensor_parallel_size, settings.data_parallel_size
    if settings.backend == "builtin":
        if len(gpus) > 1:
            problem(
                ("inference", "gpus"),
                f"lists {len(gpus)} GPUs, but the built-in backend serves on one GPU: "
                "list one, or use backend = 'vllm'",
            )
        if tp > 1:
            problem(
                ("inference", "tensor_parallel_size"),
                "is a vLLM setting: the built-in backend serves alone",
            )
        if dp > 1 and (gpus or settings.device != "cpu" or mode != "colocate"):
            problem(
                ("inference", "data_parallel_size"),
                "is a vLLM setting: the built-in backend runs replicas only on CPU in "
                "colocate (one per trainer rank, trainer.ranks)",
            )
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
        _check_colocate(inference, trainer, served, problem)
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


def _check_colocate(
    inference: InferenceSettings, trainer: Placement, served: Placement, problem: Report
) -> None:
    """``colocate`` time-shares each device: inference on the trainer's own GPUs.

    One GPU: the trainer and one server on it. N GPUs (an FSDP2 trainer of N ranks): one
    vLLM data-parallel replica (tensor parallel size 1) beside each rank, ``inference.gpus``
    the trainer's list, each replica loaded from the gathered weights on its own GPU. On
    CPU (``trainer.ranks``): the built-in server with one replica per rank.
    """
    tp, dp = inference.tensor_parallel_size, inference.data_parallel_size
    if trainer.ranks == 1 and len(served.gpus) <= 1 and dp == 1:
        if trainer.gpus and served.gpus and trainer.gpus != served.gpus:
            problem(
                ("inference", "gpus"),
                f"is {_gpu_list(served.gpus)} but trainer.gpus is {_gpu_list(trainer.gpus)}: "
                "colocate time-shares one GPU, so list the trainer's",
            )
        return
    where = "GPU" if trainer.gpus else "rank"
    if trainer.gpus and inference.backend != "vllm":
        problem(
            ("inference", "backend"),
            f"is {inference.backend!r}, but colocate on {len(trainer.gpus)} GPUs runs one vLLM "
            "replica per trainer GPU: use backend = 'vllm'",
        )
    if not trainer.gpus and trainer.on_gpu:
        problem(
            ("trainer", "gpus"),
            "is required: colocate on several GPUs runs one trainer rank and one inference "
            "replica per GPU, so list them (and the same list in inference.gpus)",
        )
    if tp != 1:
        problem(
            ("inference", "tensor_parallel_size"),
            f"is {tp}, but colocate on several GPUs runs one whole replica per trainer {where} "
            "(each loads the gathered weights on its own GPU): set tensor_parallel_size = 1",
        )
    if dp != trainer.ranks:
        problem(
            ("inference", "data_parallel_size"),
            f"is {dp}, but colocate runs one inference replica per trainer {where}: set "
            f"data_parallel_size = {trainer.ranks} (the trainer's {trainer.ranks} ranks)",
        )
