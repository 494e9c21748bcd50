"""Start-up in the plan: which role processes import before their gate, which keep a
standby, and when the trainer may load its model while inference starts."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from grpo_trainer.serve.command_lines import VLLM_LAUNCH_MODULE
from grpo_tui.plan.profile import load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.supervisor.spec import Condition, ProcessSpec

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def specs(tmp_path: Path, base: str, **tables: dict[str, Any]) -> dict[str, ProcessSpec]:
    """The plan of ``profiles/<base>`` with ``tables`` merged over its tables."""
    body = tomllib.loads((REPO / "profiles" / base).read_text())
    for name, table in tables.items():
        body[name] = {**body.get(name, {}), **table}
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(body))
    return {s.name: s for s in build_plan(load_profile(path), tmp_path / "run").specs}


def waits_for(spec: ProcessSpec) -> Condition:
    return spec.depends_on["inference"].condition


def gpu(**inference: Any) -> dict[str, Any]:
    return {"vllm_executable": CLI, **inference}


def test_the_gpu_quickstart_imports_vllm_early_keeps_a_standby_and_loads_the_trainer_beside(
    tmp_path: Path,
) -> None:
    """Its KV cache is fixed (``--kv-cache-memory-bytes``): nothing vLLM sizes at start
    changes when the trainer allocates on the shared GPU meanwhile."""
    plan = specs(tmp_path, "quickstart-gpu.toml", inference=gpu())
    inference = plan["inference"]
    assert inference.command[1:4] == ["-m", VLLM_LAUNCH_MODULE, "serve"]
    assert inference.prestart and inference.standby
    assert inference.env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert waits_for(plan["trainer"]) == Condition.STARTED
    assert plan["env"].depends_on["inference"].condition == Condition.HEALTHY


def test_vllm_sizing_its_kv_cache_from_free_memory_on_the_trainer_s_gpu_is_waited_for(
    tmp_path: Path,
) -> None:
    plan = specs(tmp_path, "quickstart-gpu.toml", inference=gpu(extra_args=[]))
    assert waits_for(plan["trainer"]) == Condition.HEALTHY


def test_on_gpus_of_its_own_vllm_starts_beside_the_trainer_whatever_it_sizes(
    tmp_path: Path,
) -> None:
    plan = specs(
        tmp_path,
        "quickstart-gpu.toml",
        inference=gpu(extra_args=[], gpus=[1], weight_transfer="nccl"),
    )
    assert plan["inference"].env["CUDA_VISIBLE_DEVICES"] == "1"
    assert waits_for(plan["trainer"]) == Condition.STARTED


def test_sglang_on_the_trainer_s_gpu_is_waited_for(tmp_path: Path) -> None:
    """SGLang sizes its memory from what is free when it starts, always."""
    plan = specs(tmp_path, "quickstart-sglang.toml", run={"mode": "lora_only"})
    assert waits_for(plan["trainer"]) == Condition.HEALTHY
    assert not plan["inference"].prestart and not plan["inference"].standby


def test_today_s_start_is_one_profile_away(tmp_path: Path) -> None:
    """The start before issue 26, for a benchmark's "before": the CLI as is, spawn, vLLM's
    own cache root, the trainer after inference's health, no standby."""
    plan = specs(
        tmp_path,
        "quickstart-gpu.toml",
        inference=gpu(vllm_preimport=False),
        process={
            "inference": {
                "standby": False,
                "env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_CACHE_ROOT": "/c"},
            },
            "trainer": {"depends_on": {"inference": "process_healthy"}},
        },
    )
    inference = plan["inference"]
    assert inference.command[:4] == [*CLI, "serve"]
    assert not inference.prestart and not inference.standby
    assert inference.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert inference.env["VLLM_CACHE_ROOT"] == "/c"
    assert waits_for(plan["trainer"]) == Condition.HEALTHY


@pytest.mark.parametrize(
    ("mode", "reload", "standby"),
    [("none", "restart", True), ("lora_restart", "in_place", True),
     ("none", "in_place", False), ("lora_only", "in_place", False),
     ("shared_vllm", "in_place", False)],
)  # fmt: skip
def test_the_built_in_server_keeps_a_standby_where_its_mode_restarts_it(
    tmp_path: Path, mode: str, reload: str, standby: bool
) -> None:
    """``none`` restarts it only with ``none_reload = "restart"``: in place by default."""
    plan = specs(tmp_path, "quickstart.toml", run={"mode": mode}, inference={"none_reload": reload})
    assert plan["inference"].prestart
    assert plan["inference"].standby is standby
    assert waits_for(plan["trainer"]) == Condition.STARTED
