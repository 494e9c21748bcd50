"""Inference-server settings: the profile's ``[inference]`` table (``InferenceSettings``).

Torch-free on purpose: ``grpo-tui check`` resolves the process plan through this module
without loading torch. The command line each engine is started with is
``command_lines.py``'s; what each weight-sync mode needs of the server is
``capabilities.py``'s.

Served names: the base model is served as ``served_model_name`` (default ``policy``), or as
``<served_model_name>-base`` when the server starts in a LoRA mode. ``lora_only`` serves each
synced adapter under a new name (``sync/lora_only.py``), ``lora_restart`` preloads it as
``served_model_name``. Environments ask for the name the trainer last reported to the rollout
API with its served version (``/status-env``'s ``served_model``), so a new adapter or a mode
switch reaches them atomically, between two groups.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

Backend = Literal["builtin", "vllm", "sglang"]
Mode = Literal["none", "shared_vllm", "lora_only", "lora_restart", "colocate"]
LORA_MODES: tuple[str, ...] = ("lora_only", "lora_restart")
SHARED_MODES: tuple[str, ...] = ("shared_vllm", "colocate")
"""Modes where the built-in server's weights are the trainer's (``--shared-weights``)."""
SGLANG_MODULE = "sglang.launch_server"
API_KEY_ENV = "VLLM_API_KEY"
"""The inference server's bearer token: vLLM's own variable for ``--api-key``, read by the
built-in server and by our clients as well, so one name works for both backends."""


def inference_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``Authorization: Bearer`` for the inference server when ``VLLM_API_KEY`` is set."""
    key = (os.environ if env is None else env).get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


BACKEND_KEYS: dict[str, str] = {
    "cpu_threads": "builtin",
    "weight_transfer": "vllm",
    "vllm_executable": "vllm",
    "kv_cache_memory_bytes": "vllm",
    "sglang_executable": "sglang",
}
"""Keys only one backend reads, and that backend: set for another, they are refused."""
VLLM_ONLY_FLAGS: dict[str, str] = {
    "--kv-cache-memory-bytes": "SGLang sizes its KV cache from --mem-fraction-static "
    "(gpu_memory_utilization)",
    "--max-model-len": "use max_model_len (SGLang: --context-length)",
    "--gpu-memory-utilization": "use gpu_memory_utilization (SGLang: --mem-fraction-static)",
    "--enforce-eager": "use enforce_eager (SGLang: --disable-cuda-graph)",
    "--tensor-parallel-size": "use tensor_parallel_size (SGLang: --tp-size)",
    "--data-parallel-size": "use data_parallel_size (SGLang: --dp-size)",
    "--max-num-seqs": "SGLang's is --max-running-requests",
    "--enable-prefix-caching": "SGLang caches prefixes unless --disable-radix-cache",
    "--no-enable-prefix-caching": "SGLang's is --disable-radix-cache",
}
"""vLLM flags a profile might carry over in ``extra_args`` when it moves to SGLang."""


def _distinct(value: list[int]) -> list[int]:
    if not value or len(set(value)) != len(value):
        raise ValueError(f"must list one or more distinct GPU indices, got {value}")
    return value


GpuIndices = Annotated[list[Annotated[int, Field(ge=0)]], AfterValidator(_distinct)]
"""Physical GPU indices (as ``nvidia-smi`` numbers them), at least one, no repeats."""


def _server_root(value: str) -> str:
    """``http(s)://host[:port]``, the root a server's ``/health`` and ``/v1`` hang off."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be http://host:port (or https://), got {value!r}")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(f"must be the server's root, without a path (no /v1), got {value!r}")
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError as error:
        raise ValueError(f"{error}: {value!r}") from None
    return value.rstrip("/")


ServerRoot = Annotated[str, AfterValidator(_server_root)]


class InferenceSettings(BaseModel):
    """How to run the inference server; field names follow vLLM's flags."""

    model_config = ConfigDict(extra="forbid")

    backend: Backend = "builtin"
    url: ServerRoot | None = Field(
        default=None,
        description=(
            "attach to this running server (vLLM, SGLang or the built-in one; `grpo-tui "
            "serve` keeps one) instead of starting one: the run starts none, never stops it, "
            "resets it to the base at its start and end, and holds its lease while it runs"
        ),
    )
    lease_ttl: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description=(
            "with url: seconds the run's lease on the server lasts unless renewed (every "
            "third of it); a run that crashed frees the server after this long"
        ),
    )
    host: str = "127.0.0.1"
    port: int = Field(default=9001, ge=1, le=65535)
    served_model_name: str = Field(default="policy", min_length=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    device: str = Field(default="cpu", description="built-in backend only: cpu, cuda, cuda:N")
    seed: int = 0
    cpu_threads: int | None = Field(
        default=None,
        ge=0,
        description=(
            "built-in backend only: torch CPU threads; default 1 on device cpu (the stack "
            "shares few cores), torch's own on cuda; 0 = torch's own"
        ),
    )
    max_lora_rank: int = Field(default=16, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    gpu_memory_gb: float | None = Field(
        default=None,
        gt=0.0,
        description=(
            "total memory of the GPU vLLM shares with the trainer (e.g. 141 for an H200): "
            "lets `grpo-tui check` verify the trainer fits beside gpu_memory_utilization"
        ),
    )
    enforce_eager: bool = False
    enable_lora: bool = Field(
        default=True,
        description=(
            "start with LoRA slots, so a switch to lora_only keeps the server (vLLM: 14-16 s "
            "more CUDA-graph capture at start, ~7% slower generation); false: such a switch "
            "restarts inference"
        ),
    )
    enable_sleep_mode: bool = Field(
        default=True,
        description=(
            "start with sleep mode, so a switch to colocate keeps the server; false: such a "
            "switch restarts inference"
        ),
    )
    none_reload: Literal["in_place", "restart"] = Field(
        default="in_place",
        description=(
            "mode none: 'in_place' = the running server loads each synced checkpoint from "
            "disk (every step by default); 'restart' = the server restarts on it (every 4)"
        ),
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        description="vLLM only: a fixed KV cache (no free-memory profiling at start)",
    )
    weight_transfer: Literal["cuda_ipc", "nccl"] = Field(
        default="cuda_ipc",
        description=(
            "vLLM shared_vllm only: 'cuda_ipc' = trainer on the same GPU holds zero-copy "
            "views of vLLM's weights (worker extension); 'nccl' = trainer on other GPUs, "
            "vLLM's native NCCL weight transfer"
        ),
    )
    gpus: GpuIndices | None = Field(
        default=None,
        description=(
            "physical GPU indices the server runs on (its CUDA_VISIBLE_DEVICES); vLLM spreads "
            "over them with tensor_parallel_size x data_parallel_size = len(gpus)"
        ),
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="vLLM only")
    data_parallel_size: int = Field(
        default=1,
        ge=1,
        description="vLLM's data-parallel replicas; built-in: CPU replicas for colocate "
        "with trainer.ranks",
    )
    vllm_executable: list[str] = Field(
        default_factory=lambda: ["vllm"],
        min_length=1,
        description="how to invoke vLLM's CLI, e.g. ['python3', '-m', 'vllm.entrypoints.cli.main']",
    )
    vllm_preimport: bool = Field(
        default=True,
        description=(
            "vLLM only: start it through grpo_trainer.serve.vllm_launch in vLLM's Python, "
            "which imports vLLM's CLI (20-30 s) before the start gate, so that the imports "
            "overlap the run's other start-up and a restart can adopt a standby that did "
            "them already; false runs vllm_executable as given. A vllm_executable other "
            "than 'vllm' or [python, '-m', 'vllm.entrypoints.cli.main'] is always run as given"
        ),
    )
    sglang_executable: list[str] = Field(
        default_factory=lambda: [sys.executable, "-m", SGLANG_MODULE],
        min_length=1,
        description="how to start SGLang's server (its own python -m sglang.launch_server)",
    )
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _gpus_mean_cuda(cls, data: Any) -> Any:
        """A server pinned to ``gpus`` runs on cuda unless ``device`` says otherwise.

        ``cuda_visible_devices`` (a string) was the earlier way to pin the server: it is
        refused with the line that replaces it, so that one key says where a role runs.
        """
        if not isinstance(data, dict):
            return data
        if "cuda_visible_devices" in data:
            raise ValueError(
                "cuda_visible_devices was replaced by gpus, a list of GPU indices "
                "(cuda_visible_devices = '0,1' is gpus = [0, 1]); the trainer's GPUs "
                "are [trainer] gpus"
            )
        if data.get("gpus") and "device" not in data:
            return {**data, "device": "cuda"}
        return data

    @model_validator(mode="after")
    def _one_backends_keys(self) -> InferenceSettings:
        """A key set for another backend is refused, naming it: it would change nothing, or
        reach the engine as a flag it does not know."""
        for key, owner in BACKEND_KEYS.items():
            if key in self.model_fields_set and owner != self.backend:
                name = "built-in backend" if owner == "builtin" else f"{owner} backend"
                raise ValueError(f"{key} is a {name} setting: {self.backend} has no such flag")
        if self.backend == "sglang":
            for arg in self.extra_args:
                flag = arg.split("=", 1)[0]
                if flag in VLLM_ONLY_FLAGS:
                    raise ValueError(
                        f"extra_args: {flag} is a vLLM flag, not SGLang's; {VLLM_ONLY_FLAGS[flag]}"
                    )
        return self

    @property
    def cpu_threads_flag(self) -> list[str]:
        """``--cpu-threads N`` for the built-in server: 1 on cpu unless set; GPU untouched."""
        if self.cpu_threads is not None:
            return ["--cpu-threads", str(self.cpu_threads)]
        return ["--cpu-threads", "1"] if self.device == "cpu" else []

    @property
    def sizes_kv_from_free_memory(self) -> bool:
        """Whether the engine sizes its KV cache from the GPU memory free while it starts,
        so that another process allocating on its GPU meanwhile shrinks or fails it: vLLM
        unless ``kv_cache_memory_bytes`` (or ``--kv-cache-memory-bytes`` in ``extra_args``)
        fixes the size, SGLang always
        (``--mem-fraction-static`` of the free memory); the built-in server allocates per
        batch."""
        if self.backend == "vllm":
            flag = "--kv-cache-memory-bytes"
            fixed = any(a == flag or a.startswith(f"{flag}=") for a in self.extra_args)
            return not fixed and self.kv_cache_memory_bytes is None
        return self.backend == "sglang"

    @property
    def base_url(self) -> str:
        """Root URL of the server (``/health``, ``/v1/...`` hang off it): ``url`` when the
        run attaches to a running one."""
        return self.url or f"http://{self.host}:{self.port}"

    @property
    def external(self) -> bool:
        """The run attaches to a server it does not own (``url``)."""
        return self.url is not None

    def base_model_name(self, mode: str) -> str:
        """The name the base model is served under in ``mode``."""
        return f"{self.served_model_name}-base" if mode in LORA_MODES else self.served_model_name


def request_model_name(settings: InferenceSettings, mode: str) -> str:
    """The ``model`` environments ask for until the trainer reports one to the rollout API.

    vLLM and the built-in server serve the preloaded ``lora_restart`` adapter under
    ``served_model_name``; SGLang's OpenAI API picks an adapter by ``<base>:<adapter>``.
    """
    if settings.backend == "sglang" and mode in LORA_MODES:
        return f"{settings.base_model_name(mode)}:{settings.served_model_name}"
    return settings.served_model_name
