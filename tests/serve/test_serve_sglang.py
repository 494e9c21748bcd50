"""The SGLang backend: its command lines, what ``check`` refuses, the request name of the
adapter, the completion answers environments parse, and the weight-update calls.

SGLang cannot run on this CPU CI (it is a GPU server, not installed here): the answer
shapes below are SGLang's documented ones (its OpenAI protocol's CompletionResponse, the
RL guide's update endpoints), and the weight-update calls go to a stand-in transport that
records them. ``benchmarks/sglang_device.sh`` runs the real server on a GPU (H200s,
2026-11-26: ``benchmarks/results/sglang_modes.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from grpo_trainer.envs.inference import parse_samples
from grpo_trainer.serve.command_lines import SGLANG_REFUSED, inference_command
from grpo_trainer.serve.settings import InferenceSettings, request_model_name
from grpo_trainer.sync.base import SyncContext
from grpo_trainer.sync.client import InferenceClient, SyncError
from grpo_trainer.sync.lora_only import HotSwapSync
from grpo_trainer.sync.sglang import update_from_disk
from grpo_trainer.train.config import TrainerConfig
from grpo_tui.plan.profile import ProfileError, load_profile
from grpo_tui.plan.roles import build_plan
from grpo_tui.supervisor.samplers import generation_tokens

REPO = Path(__file__).resolve().parents[2]
SGLANG = InferenceSettings(backend="sglang", port=30000, dtype="bfloat16", max_model_len=512)


def test_full_weight_modes_serve_the_stable_name_on_loopback() -> None:
    argv = inference_command(SGLANG, mode="none", model="/m").argv
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]

    def flags(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flags("--model-path") == "/m"
    assert flags("--host") == "127.0.0.1" and flags("--port") == "30000"
    assert flags("--served-model-name") == "policy"
    assert flags("--context-length") == "512" and flags("--random-seed") == "0"
    assert "--enable-metrics" in argv
    assert request_model_name(SGLANG, "none") == "policy"
    # LoRA slots, so a switch to lora_only keeps the server, unless the profile turns them off
    assert "--enable-lora" in argv and flags("--lora-target-modules") == "all"
    plain = SGLANG.model_copy(update={"enable_lora": False})
    assert "--enable-lora" not in inference_command(plain, mode="none", model="/m").argv


def test_vllm_only_keys_and_flags_are_refused_for_sglang_naming_them() -> None:
    with pytest.raises(ValueError, match="kv_cache_memory_bytes is a vllm backend setting"):
        InferenceSettings(backend="sglang", kv_cache_memory_bytes=1 << 30)
    with pytest.raises(ValueError, match="weight_transfer is a vllm backend setting: sglang"):
        InferenceSettings(backend="sglang", weight_transfer="nccl")
    with pytest.raises(ValueError, match="sglang_executable is a sglang backend setting: vllm"):
        InferenceSettings(backend="vllm", sglang_executable=["sglang"])
    with pytest.raises(ValueError, match=r"extra_args: --kv-cache-memory-bytes is a vLLM flag"):
        InferenceSettings(backend="sglang", extra_args=["--kv-cache-memory-bytes", "1"])
    with pytest.raises(ValueError, match=r"--max-num-seqs is a vLLM flag.*--max-running-requests"):
        InferenceSettings(backend="sglang", extra_args=["--max-num-seqs=8"])
    ok = InferenceSettings(backend="sglang", extra_args=["--max-running-requests", "8"])
    assert inference_command(ok, mode="none", model="/m").argv[-2:] == [
        "--max-running-requests",
        "8",
    ]


@pytest.mark.parametrize("mode", ["lora_only", "lora_restart"])
def test_lora_modes_serve_the_base_and_ask_for_the_adapter_by_base_colon_name(mode: str) -> None:
    argv = inference_command(SGLANG, mode=mode, model="/m").argv
    assert argv[argv.index("--served-model-name") + 1] == "policy-base"
    assert argv[argv.index("--max-lora-rank") + 1] == "16"
    assert argv[argv.index("--lora-target-modules") + 1] == "all"
    assert "--lora-paths" not in argv
    restarted = inference_command(SGLANG, mode=mode, model="/m", adapter="/a/step_4").argv
    assert restarted[restarted.index("--lora-paths") + 1] == "policy=/a/step_4"
    assert request_model_name(SGLANG, mode) == "policy-base:policy"


def test_settings_map_onto_sglang_flag_names() -> None:
    settings = SGLANG.model_copy(
        update={"gpu_memory_utilization": 0.4, "enforce_eager": True, "tensor_parallel_size": 2}
    )
    argv = inference_command(settings, mode="none", model="/m").argv
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.4"
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert "--disable-cuda-graph" in argv
    with pytest.raises(ValueError, match="cpu_threads is a built-in backend setting: sglang"):
        InferenceSettings(backend="sglang", cpu_threads=2)


@pytest.mark.parametrize("mode", sorted(SGLANG_REFUSED))
def test_modes_sglang_cannot_run_are_refused_by_check_with_the_reason(
    mode: str, tmp_path: Path
) -> None:
    profile = tmp_path / "sglang.toml"
    profile.write_text(
        f'[run]\nmode = "{mode}"\noutput_dir = "{tmp_path}"\n[api]\n'
        '[inference]\nbackend = "sglang"\n[trainer]\nbatch_size = 16\n[[env]]\ntask = "toy"\n'
    )
    with pytest.raises(ProfileError) as caught:
        build_plan(load_profile(profile))
    (problem,) = caught.value.problems
    assert problem.key == "inference"
    assert problem.message == f"backend sglang cannot run mode {mode!r}: {SGLANG_REFUSED[mode]}"


def test_check_prints_the_sglang_plan_and_the_env_asks_for_the_adapter(tmp_path: Path) -> None:
    profile = tmp_path / "sglang.toml"
    profile.write_text(
        f'[run]\nmode = "lora_only"\noutput_dir = "{tmp_path}"\n[api]\n'
        '[inference]\nbackend = "sglang"\n[trainer]\nbatch_size = 16\n[[env]]\ntask = "toy"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "check", str(profile)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "-m sglang.launch_server --model-path" in out.stdout
    assert "--model-name policy-base:policy" in out.stdout
    # SGLang 0.5.17 releases an n > 1 request's adapter once more than it acquired it, so
    # its unload waits forever: environments ask it for prompt copies instead.
    assert "--prompt-copies true" in out.stdout
    vllm = profile.read_text().replace('"sglang"', '"vllm"')
    profile.write_text(vllm.replace('task = "toy"', 'task = "toy"\nprompt_copies = true'))
    out = subprocess.run(
        [sys.executable, "-m", "grpo_tui", "check", str(profile)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 2
    assert "env[0].prompt_copies" in out.stderr and "inference.backend" in out.stderr


# SGLang's CompletionResponse for prompt=[ids], n=2, logprobs=0, return_token_ids=true
# (fields as python/sglang/srt/entrypoints/openai/protocol.py declares them).
SGLANG_ANSWER = {
    "id": "cmpl-5b0c",
    "object": "text_completion",
    "created": 1767225600,
    "model": "policy-base:policy",
    "choices": [
        {
            "index": 1,
            "text": "77",
            "logprobs": {
                "text_offset": [0, 1],
                "token_logprobs": [-0.25, -1.5],
                "tokens": ["7", "7"],
                "top_logprobs": [None, None],
            },
            "finish_reason": "length",
            "matched_stop": None,
            "token_ids": [22, 22],
        },
        {
            "index": 0,
            "text": "7",
            "logprobs": {
                "text_offset": [0],
                "token_logprobs": [-0.5],
                "tokens": ["7"],
                "top_logprobs": [None],
            },
            "finish_reason": "stop",
            "matched_stop": 151643,
            "token_ids": [22],
        },
    ],
    "usage": {"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3},
}


def test_environments_parse_sglangs_completion_answer() -> None:
    asked = [[7] * 12, [7] * 12]  # one prompt, n=2: the same prompt asked twice
    first, second = parse_samples(json.dumps(SGLANG_ANSWER).encode(), asked)
    assert (first.token_ids, first.logprobs, first.truncated) == ([22], [-0.5], False)
    assert (second.token_ids, second.logprobs, second.truncated) == ([22, 22], [-0.25, -1.5], True)


def test_the_token_rate_reads_sglangs_counter() -> None:
    text = (
        "# TYPE sglang:generation_tokens_total counter\n"
        'sglang:generation_tokens_total{model_name="policy",tp_rank="0"} 1.5e+03\n'
        'sglang:generation_tokens_total{model_name="policy",tp_rank="1"} 500\n'
        "sglang:gen_throughput 812.5\n"
    )
    assert generation_tokens(text) == 2000.0


class Recorder:
    """A stand-in for SGLang's HTTP API: records each call, answers from a table."""

    def __init__(self, answers: dict[str, tuple[int, dict[str, object]]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, object]]] = []

    def client(self) -> InferenceClient:
        client = InferenceClient("http://127.0.0.1:30000", attempts=1)
        client.http = httpx.Client(
            base_url=client.base_url, transport=httpx.MockTransport(self.handle)
        )
        return client

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.calls.append((request.url.path, body))
        status, answer = self.answers.get(request.url.path, (200, {"success": True}))
        return httpx.Response(status, json=answer)


def served(tmp_path: Path, *names: str) -> list[Path]:
    """Adapter directories as the trainer leaves them in ``served/``."""
    paths = [tmp_path / "served" / name for name in names]
    for path in paths:
        path.mkdir(parents=True)
        (path / "adapter_config.json").write_text(json.dumps({"name": path.name}))
    return paths


def sglang_lora_sync(api: Recorder, tmp_path: Path) -> HotSwapSync:
    strategy = HotSwapSync(SyncContext("http://127.0.0.1:30000", "policy", tmp_path, "sglang"))
    strategy.client = api.client()
    return strategy


def test_each_adapter_is_loaded_under_a_new_name_and_asked_for_by_base_colon_name(
    tmp_path: Path,
) -> None:
    """No pause and no unload before the load: SGLang's unload waits for the requests that
    hold the adapter (a pause would hold them forever); the one two loads old goes."""
    paths = served(tmp_path, "adapter_step_3", "adapter_step_4", "adapter_step_5")
    models = {"object": "list", "data": [{"id": "policy-base", "parent": None}]}
    api = Recorder({"/v1/models": (200, models)})
    strategy = sglang_lora_sync(api, tmp_path)
    names = [strategy.load_adapter(path, f"step{n + 3}") for n, path in enumerate(paths)]
    assert len(set(names)) == 3 and all(n.startswith("policy-step") for n in names)
    loads = [(path, body) for path, body in api.calls if path != "/v1/models"]
    assert loads == [
        ("/load_lora_adapter", {"lora_name": names[0], "lora_path": str(paths[0].resolve())}),
        ("/load_lora_adapter", {"lora_name": names[1], "lora_path": str(paths[1].resolve())}),
        ("/load_lora_adapter", {"lora_name": names[2], "lora_path": str(paths[2].resolve())}),
        ("/unload_lora_adapter", {"lora_name": names[0]}),
    ]
    assert strategy.served_model == f"policy-base:{names[2]}"
    assert strategy.loaded == names[1:]


def test_sglangs_refusals_raise_and_an_unload_it_refuses_is_tried_again(tmp_path: Path) -> None:
    (adapter,) = served(tmp_path, "adapter_step_5")
    refused = Recorder(
        {"/load_lora_adapter": (400, {"success": False, "error_message": "rank 64 > 16"})}
    )
    with pytest.raises(SyncError, match="rank 64 > 16"):
        sglang_lora_sync(refused, tmp_path).load_adapter(adapter, "step5")
    flag_only = Recorder(
        {"/load_lora_adapter": (200, {"success": False, "error_message": "rank 64 > 16"})}
    )
    with pytest.raises(SyncError, match="adapter load failed: rank 64 > 16"):
        sglang_lora_sync(flag_only, tmp_path).load_adapter(adapter, "step5")
    busy = Recorder({"/unload_lora_adapter": (200, {"success": False, "message": "in use"})})
    strategy = sglang_lora_sync(busy, tmp_path)
    strategy.base = "policy-base"
    names = [strategy.load_adapter(adapter, f"step{n}") for n in range(4)]
    assert strategy.loaded == names  # nothing unloaded: kept for the next try
    unloads = [body["lora_name"] for path, body in busy.calls if path == "/unload_lora_adapter"]
    assert unloads == [names[0], names[0], names[1]]


def test_full_weights_reloaded_from_disk_and_a_failure_says_why() -> None:
    api = Recorder({})
    update_from_disk(api.client(), "/ckpt/served/step_7", 7)
    assert api.calls == [
        (
            "/update_weights_from_disk",
            {"model_path": "/ckpt/served/step_7", "weight_version": "7", "flush_cache": True},
        )
    ]
    bad = Recorder({"/update_weights_from_disk": (200, {"success": False, "message": "shape"})})
    with pytest.raises(SyncError, match="weight update failed: shape"):
        update_from_disk(bad.client(), "/x", 1)


def test_the_trainer_picks_the_sglang_strategies(tmp_path: Path) -> None:
    from grpo_trainer.sync.none import ReloadSync
    from grpo_trainer.sync.registry import make_strategy

    context = SyncContext("http://127.0.0.1:30000", "policy", tmp_path, "sglang")
    assert isinstance(make_strategy("none", context), ReloadSync)  # no restart, no link
    assert isinstance(make_strategy("lora_only", context), HotSwapSync)
    with pytest.raises(ValueError, match="backend sglang cannot run mode 'shared_vllm'"):
        make_strategy("shared_vllm", context)


@pytest.mark.parametrize(("backend", "mode", "every", "extra"), [
    ("sglang", "none", 1, ""), ("vllm", "none", 1, ""), ("sglang", "lora_restart", 4, ""),
    ("vllm", "none", 4, 'none_reload = "restart"\n'),
])  # fmt: skip
def test_none_syncs_every_step_by_default(
    tmp_path: Path, backend: str, mode: str, every: int, extra: str
) -> None:
    """A restart of vLLM takes a minute, so the restart modes sync every few steps; ``none``
    reloads full weights in place (SGLang: 65 ms on an H200), so it syncs every step and
    needs no supervisor to restart anything, unless ``none_reload`` asks for restarts."""
    profile = tmp_path / "p.toml"
    profile.write_text(
        f'[run]\nmode = "{mode}"\noutput_dir = "{tmp_path}"\n[api]\n'
        f'[inference]\nbackend = "{backend}"\n{extra}[trainer]\nbatch_size = 16\n'
        '[[env]]\ntask = "toy"\n'
    )
    (trainer,) = [s for s in build_plan(load_profile(profile)).specs if s.name == "trainer"]
    argv = trainer.command  # a value equal to the trainer's default is not passed
    default = TrainerConfig.model_fields["sync_every"].default
    passed = argv[argv.index("--sync-every") + 1] if "--sync-every" in argv else str(default)
    assert passed == str(every)
