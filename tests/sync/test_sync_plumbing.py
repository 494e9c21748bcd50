"""Parts of the sync path that run without a GPU: vLLM's fused-name mapping, failures, registry."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from sync_helpers import SocketSupervisor, VllmStandIn, free_port

from grpo_trainer.control import SupervisorLink
from grpo_trainer.models import build_tiny_model, load_model
from grpo_trainer.sync.base import MODES, SyncContext
from grpo_trainer.sync.client import InferenceClient, InferenceUnreachable, SyncError
from grpo_trainer.sync.colocate import ColocateSharedSync, VllmColocateSync
from grpo_trainer.sync.lora_only import HotSwapSync
from grpo_trainer.sync.none import ReloadSync
from grpo_trainer.sync.registry import make_strategy
from grpo_trainer.sync.shared import SharedFileSync
from grpo_trainer.sync.vllm_names import hf_views, kernel_tensors
from grpo_trainer.sync.vllm_shared import VllmSharedSync
from grpo_trainer.sync.vllm_worker import SharedWeightsExtension

PADDED_VOCAB = 64


def vllm_layout(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights laid out as vLLM holds them: fused qkv / gate_up, padded vocab."""
    params = {name: p.detach() for name, p in model.named_parameters()}
    fused: dict[str, torch.Tensor] = {}
    for name, tensor in params.items():
        if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
            continue
        if ".q_proj." in name:
            parts = [name, name.replace("q_proj", "k_proj"), name.replace("q_proj", "v_proj")]
            fused[name.replace("q_proj", "qkv_proj")] = torch.cat([params[p] for p in parts])
        elif ".gate_proj." in name:
            parts = [name, name.replace("gate_proj", "up_proj")]
            fused[name.replace("gate_proj", "gate_up_proj")] = torch.cat([params[p] for p in parts])
        elif "embed_tokens" in name:
            pad = torch.zeros(PADDED_VOCAB - tensor.shape[0], tensor.shape[1])
            fused[name] = torch.cat([tensor, pad])
        else:
            fused[name] = tensor.clone()
    return fused


def test_hf_views_cover_every_parameter_without_copying(tmp_path: Path) -> None:
    model = load_model(build_tiny_model(tmp_path / "m", seed=3))
    layout = vllm_layout(model)
    assert any("qkv_proj" in n for n in layout) and any("gate_up_proj" in n for n in layout)
    views = hf_views(layout, model.config)
    params = dict(model.named_parameters())
    assert set(views) == set(params)
    for name, param in params.items():
        assert torch.equal(views[name], param.detach()), name
    qkv = next(t for n, t in layout.items() if "qkv_proj.weight" in n)
    v_view = views[next(n for n in views if "v_proj.weight" in n)]
    v_view.fill_(7.0)
    assert (qkv[-v_view.shape[0] :] == 7.0).all(), "a write to the view must reach vLLM's tensor"


def test_kernel_tensors_build_vllms_layout_from_hf_parameters(tmp_path: Path) -> None:
    model = load_model(build_tiny_model(tmp_path / "m", seed=3))
    expected = vllm_layout(model)
    layout = [(name, list(t.shape), "bfloat16") for name, t in reversed(expected.items())]
    built = dict(kernel_tensors(iter(model.named_parameters()), layout))
    assert list(built) == [name for name, _, _ in layout], "sent in the order vLLM was told"
    for name, tensor in expected.items():
        assert built[name].dtype == torch.bfloat16
        assert torch.equal(built[name], tensor.to(torch.bfloat16)), name
    views = hf_views({n: t.float() for n, t in built.items()}, model.config)
    for name, param in model.named_parameters():
        assert torch.equal(views[name], param.detach().to(torch.bfloat16).float()), name


def test_kernel_tensors_refuse_a_missing_extra_or_misshapen_parameter(tmp_path: Path) -> None:
    model = load_model(build_tiny_model(tmp_path / "m", seed=3))
    layout = [(name, list(t.shape), "float32") for name, t in vllm_layout(model).items()]
    params = list(model.named_parameters())
    no_v = [(n, p) for n, p in params if ".v_proj.weight" not in n]
    with pytest.raises(ValueError, match=r"no trainer parameter .*v_proj"):
        list(kernel_tensors(iter(no_v), layout))
    extra = [*params, ("model.layers.9.mlp.down_proj.weight", params[-1][1])]
    with pytest.raises(ValueError, match=r"no tensor for the trainer's model\.layers\.9"):
        list(kernel_tensors(iter(extra), layout))
    narrow = [(n, [s[0], s[1] + 1] if "o_proj.weight" in n else s, d) for n, s, d in layout]
    with pytest.raises(ValueError, match=r"o_proj\.weight: the trainer builds"):
        list(kernel_tensors(iter(params), narrow))


def test_a_sync_against_a_dead_server_raises_with_the_reason(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = InferenceClient(url, attempts=2, backoff=0.01)
    with pytest.raises(SyncError, match="ConnectError"):
        client.post("/resume")
    with pytest.raises(SyncError, match="not 200 within"):
        client.wait_healthy(0.3)
    strategy = HotSwapSync(SyncContext(url, "policy", tmp_path, "builtin"))
    strategy.client = client
    with pytest.raises(SyncError, match="load_lora_adapter"):
        strategy.load_adapter(tmp_path, "step1")


def test_registry_picks_one_strategy_per_mode_and_backend(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GRPO_TUI_SOCKET", raising=False)
    context = SyncContext("http://127.0.0.1:1", "policy", tmp_path, "builtin")
    restarting = SyncContext(
        "http://127.0.0.1:1", "policy", tmp_path, "builtin", none_reload="restart"
    )
    for mode, where in (("none", restarting), ("lora_restart", context)):
        with pytest.raises(SyncError, match="GRPO_TUI_SOCKET"):
            make_strategy(mode, where)
    assert isinstance(make_strategy("none", context), ReloadSync)  # in place: no supervisor
    assert isinstance(make_strategy("lora_only", context), HotSwapSync)
    assert isinstance(make_strategy("shared_vllm", context), SharedFileSync)
    vllm = SyncContext("http://127.0.0.1:1", "policy", tmp_path, "vllm")
    assert isinstance(make_strategy("shared_vllm", vllm), VllmSharedSync)
    assert isinstance(make_strategy("colocate", context), ColocateSharedSync)
    assert isinstance(make_strategy("colocate", vllm), VllmColocateSync)
    with pytest.raises(ValueError, match="unknown weight-sync mode"):
        make_strategy("legacy", context)
    with pytest.raises(ValueError, match="backend"):
        make_strategy("lora_only", SyncContext("u", "p", tmp_path, "tgi"))
    assert set(MODES) == {"none", "lora_only", "lora_restart", "shared_vllm", "colocate"}


def test_lora_modes_refuse_a_full_model(tmp_path: Path) -> None:
    model = load_model(build_tiny_model(tmp_path / "m", seed=3))
    strategy = HotSwapSync(SyncContext("http://127.0.0.1:1", "policy", tmp_path, "builtin"))
    with pytest.raises(SyncError, match="peft"):
        strategy.attach(model)


class _Worker(SharedWeightsExtension):
    """A vLLM GPU worker as the extension sees it: the live model, and vLLM 0.24's direct
    copy (``gpu_worker.update_weights`` with ``is_checkpoint_format=False``) as written there:
    ``param.copy_`` with grad enabled, into parameters that require grad."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model_runner = type("Runner", (), {"model": model})()

    def update_weights(self, update_info: dict) -> None:
        model = self.model_runner.model
        for name, values in zip(update_info["names"], update_info["values"], strict=True):
            model.get_parameter(name).copy_(torch.tensor(values))


def test_worker_runs_vllms_direct_copy_under_no_grad(tmp_path: Path) -> None:
    model = load_model(build_tiny_model(tmp_path / "m", seed=3))
    worker = _Worker(model)
    name = "model.norm.weight"
    values = worker.grpo_parameter_values(name)
    assert values == model.get_parameter(name).detach().tolist()
    info = {"names": [name], "values": [[v + 1.0 for v in values]]}
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        worker.update_weights(info)  # vLLM's own call: the failure seen on the H200
    worker.grpo_update_weights(json.dumps(info))
    assert model.get_parameter(name).detach().tolist() == info["values"][0]


def test_a_failed_direct_copy_probe_falls_back_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM refuses the probe's weight update: the sync sends in checkpoint format, and a
    warning naming vLLM's reason reaches the trainer's log and the supervisor's events."""
    model = load_model(build_tiny_model(tmp_path / "m", seed=3))
    refusal = "weight transfer engine is not initialized"
    vllm = VllmStandIn(vllm_layout(model), refusal)
    supervisor = SocketSupervisor(tmp_path / "control.sock", restart=lambda args: None)
    link = SupervisorLink(str(supervisor.path), process="trainer")
    context = SyncContext(vllm.url, "policy", tmp_path, "vllm")
    strategy = make_strategy("shared_vllm", context, link=link)
    try:
        assert isinstance(strategy, VllmSharedSync)
        assert strategy._kernel_layout(model) is None  # None: send in checkpoint format
        assert link.flush(timeout=10)
        deadline = time.monotonic() + 10
        while not supervisor.events and time.monotonic() < deadline:
            time.sleep(0.05)  # the peer's handler thread reads what the link sent
    finally:
        strategy.close()
        link.close()
        supervisor.close()
        vllm.close()
    assert "/start_weight_update" in vllm.paths
    [event] = supervisor.events
    assert event["level"] == "warning"
    assert "direct-copy weight update failed" in event["message"]
    assert refusal in event["message"] and "checkpoint format" in event["message"]
    assert f"[warning] {event['message']}" in capsys.readouterr().err


class PauseEndpoints:
    """``/pause`` and ``/resume`` answering ``status``, as a server on its way down or one
    refusing: a real HTTP server on a free port; ``close`` takes it away."""

    def __init__(self, status: int, delay: float = 0.0) -> None:
        self.paths: list[str] = []
        endpoints = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                endpoints.paths.append(self.path.split("?")[0])
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def paused_update(url: str, tmp_path: Path) -> SharedFileSync:
    strategy = SharedFileSync(SyncContext(url, "policy", tmp_path, "builtin"))
    strategy.client = InferenceClient(url, timeout=0.3, attempts=2, backoff=0.01)
    return strategy


def test_the_optimizer_step_goes_on_when_the_server_is_gone_not_when_it_refuses(
    tmp_path: Path,
) -> None:
    """shared_vllm pauses generation around the optimizer step. A server killed just before
    (nothing listens) samples nothing: the fault suite's trainer died on this pause with a
    traceback and was restarted. A server that answers and refuses is an error still."""
    gone = paused_update(f"http://127.0.0.1:{free_port()}", tmp_path)
    gone.before_optimizer_step()
    gone.after_optimizer_step()

    paused = PauseEndpoints(200)
    strategy = paused_update(paused.url, tmp_path)
    strategy.before_optimizer_step()
    paused.close()  # killed while paused: its successor starts unpaused
    strategy.after_optimizer_step()
    assert paused.paths == ["/pause"]

    for answer, match in ((PauseEndpoints(409), "HTTP 409"), (PauseEndpoints(200, 1.0), "Timeout")):
        try:  # refused, or too slow to answer: alive, and the step must not go on unpaused
            with pytest.raises(SyncError, match=match) as refused:
                paused_update(answer.url, tmp_path).before_optimizer_step()
            assert not isinstance(refused.value, InferenceUnreachable)
        finally:
            answer.close()
