"""``shared_vllm`` NCCL weight sync across two GPUs vs a raw broadcast of the same bytes.

For each Qwen2.5 shape (random init, bf16, real vocabulary): vLLM serves the shape on one
GPU (``--load-format dummy``: no weight files to write or read), the trainer's model sits
on another, and the trainer's real ``shared_vllm`` strategy (``VllmSharedSync``: pause,
``/start_weight_update``, ``/update_weights`` while it broadcasts over NCCL, finish,
resume) syncs ``--syncs`` times. Then, with vLLM stopped, two plain processes on the same
two GPUs time ``torch.distributed.broadcast`` of the same bytes: one flat buffer (the
link's limit) and the same per-parameter tensors one after another. One table, one call:

    python benchmarks/nccl_sync.py --out $OUT --shapes qwen2.5-0.5b qwen2.5-1.5b qwen2.5-3b

``--variants`` (issue 29) measures the sync's fixed costs and the delta transfer on the
same server, one row each (``VARIANTS``): vLLM's pause modes, the prefix-cache reset after
the resume (``/pause`` already clears the caches), vLLM's packed broadcast buffer, and
``weight_transfer_delta`` at the update sparsity of a real optimizer step. That sparsity is
measured first (``update_sparsity``: a two-layer slice of the shape in float32, as FSDP2
keeps its masters, one AdamW step at each ``--lrs`` on a real loss, the share of bf16
elements that changed); each delta sync then follows a change of that share of the
served model's elements (one bf16 ulp each), after a first, dense, delta sync. Overlap of
the gather and the send is a multi-rank trainer's (``sync/sharded.py``) and not measured
here (one trainer process holds the whole model).

    python benchmarks/nccl_sync.py --out $OUT --shapes qwen2.5-7b --variants all

Needs vLLM (>= 0.22, native weight transfer) and two CUDA devices; NVLink multicast off
(``NCCL_NVLS_ENABLE=0``) in the environment, as every process of ours on these machines.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from model_shapes import qwen2_config

GB = 1e9
VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "keep": {"pause_mode": "keep"},
    "noreset": {"reset_after_resume": False},
    "keep-noreset": {"pause_mode": "keep", "reset_after_resume": False},
    "buffer256": {"packed_buffer_bytes": 256 << 20},
    "delta": {"delta": True},
    "delta-bucket64": {"delta": True, "delta_bucket_bytes": 64 << 20},
}
"""Sync variants: the strategy's switches (``VllmSharedSync``); ``delta`` rows run once per
``--lrs`` value at that learning rate's measured sparsity."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vllm_settings(args: argparse.Namespace, port: int) -> Any:
    """The inference settings of the vLLM side: the real role-layer command builder's input."""
    from grpo_trainer.serve.settings import InferenceSettings

    return InferenceSettings(
        backend="vllm",
        port=port,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=512,
        gpu_memory_utilization=args.gpu_memory_utilization,
        gpus=[args.vllm_gpu],
        vllm_executable=[sys.executable, "-m", "vllm.entrypoints.cli.main"],
        extra_args=["--load-format", "dummy", "--skip-tokenizer-init"],
    )


def update_sparsity(shape: str, lr: float, device: Any) -> float:
    """Share of bf16 elements changed by one AdamW step at ``lr`` on float32 masters.

    A two-layer slice of ``shape`` (its embeddings, head and two decoder layers, at the
    shape's widths), a causal-LM loss on random tokens, one optimizer step.
    """
    import torch
    from transformers import Qwen2ForCausalLM

    config = qwen2_config(shape)
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).float()
    before = [p.detach().to(torch.bfloat16) for p in model.parameters()]
    ids = torch.randint(0, config.vocab_size, (4, 256), device=device)
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.AdamW(model.parameters(), lr=lr).step()
    changed = sum(
        int((p.detach().to(torch.bfloat16).view(torch.int16) != b.view(torch.int16)).sum())
        for p, b in zip(model.parameters(), before, strict=True)
    )
    total = sum(b.numel() for b in before)
    del model, before
    torch.cuda.empty_cache()
    return changed / total


def nudge(params: list[Any], fraction: float, generator: Any) -> None:
    """Change ``fraction`` of the elements of bf16 ``params`` by one ulp (their last bit)."""
    import torch

    with torch.no_grad():
        for p in params:
            mask = torch.rand(p.shape, device=p.device, generator=generator) < fraction
            words = p.view(torch.int16)
            words[mask] = words[mask] ^ 1


def measure_variants(
    strategy: Any, model: Any, args: argparse.Namespace, sparsity: dict[float, float]
) -> list[dict[str, Any]]:
    """Each ``--variants`` row: sync times, phases, bytes sent, changed share."""
    import torch

    from grpo_trainer.sync.delta import DeltaSender, Entry

    params = list(model.parameters())
    generator = torch.Generator(device=params[0].device).manual_seed(0)
    rows = []
    names = list(VARIANTS) if args.variants == ["all"] else args.variants
    for name in names:
        knobs = dict(VARIANTS[name])
        delta = knobs.pop("delta", False)
        for lr in args.lrs if delta else [None]:
            row: dict[str, Any] = {"variant": name, "lr": lr}
            saved = {k: getattr(strategy, k) for k in knobs}
            try:
                for key, value in knobs.items():
                    setattr(strategy, key, value)
                if delta:
                    layout = [Entry(n, tuple(s), d) for n, s, d in strategy._layout]
                    strategy._delta = DeltaSender(layout, strategy.delta_bucket_bytes)
                    strategy.sync(model, 0)  # the first delta sync is dense
                    row["sparsity"] = sparsity[lr]
                times, phases, sent = [], [], []
                for step in range(1, args.syncs + 1):
                    if delta:
                        nudge(params, sparsity[lr], generator)
                    else:
                        with torch.no_grad():
                            for p in params:
                                p.add_(1e-3)
                    torch.cuda.synchronize()
                    outcome = strategy.sync(model, step)
                    times.append(outcome.sync_time)
                    phases.append(outcome.phases)
                    if delta and strategy.last_send is not None:
                        sent.append(strategy.last_send)
                row["sync_s"] = times
                row["phases"] = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
                if sent:
                    row["bytes_sent"] = statistics.median(s.bytes_sent for s in sent)
                    row["changed"] = statistics.median(s.changed_fraction for s in sent)
            except Exception as error:  # one variant failing keeps the others
                row["error"] = f"{type(error).__name__}: {error}"[:500]
            finally:
                for key, value in saved.items():
                    setattr(strategy, key, value)
                strategy._delta = None
            print(f"nccl_sync: variant {name} lr {lr}: {row}", flush=True)
            rows.append(row)
            partial = args.out / "nccl_sync_partial.json"  # a cut call keeps these rows
            partial.write_text(json.dumps({"variants": rows, "sparsity": sparsity}, indent=1))
    return rows


def measure_sync(shape: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start vLLM on ``shape``, attach the real strategy, time ``args.syncs`` syncs."""
    import torch
    from transformers import Qwen2ForCausalLM

    from grpo_trainer.serve.command_lines import inference_command
    from grpo_trainer.serve.launch import ServerProcess
    from grpo_trainer.sync.base import SyncContext
    from grpo_trainer.sync.vllm_shared import VllmSharedSync

    model_dir = work / shape
    sparsity = {}
    if args.variants:  # before vLLM and the served-size model take memory
        device = torch.device(f"cuda:{args.trainer_gpu}")
        sparsity = {lr: update_sparsity(shape, lr, device) for lr in args.lrs}
        print(f"nccl_sync: {shape} bf16 elements changed by one AdamW step: {sparsity}", flush=True)
    config = qwen2_config(shape)
    config.save_pretrained(model_dir)
    port = free_port()
    settings = vllm_settings(args, port)
    launch = inference_command(settings, mode="shared_vllm", model=str(model_dir))
    # The role layer's launcher pins a server to its gpus; this script starts it directly.
    launch = launch.model_copy(
        update={"env": {**launch.env, "CUDA_VISIBLE_DEVICES": str(args.vllm_gpu)}}
    )
    server = ServerProcess(launch, f"http://127.0.0.1:{port}", work / f"{shape}-vllm.log")
    result: dict[str, Any] = {"shape": shape, "sparsity": sparsity}
    started = server.start(timeout=args.start_timeout)
    result["vllm_start_s"] = started
    try:
        device = torch.device(f"cuda:{args.trainer_gpu}")
        torch.cuda.set_device(device)
        torch.manual_seed(0)
        with torch.device(device):  # init on the GPU: a 3B model inits in seconds, not minutes
            model = Qwen2ForCausalLM(config).to(dtype=torch.bfloat16)
        params = list(model.parameters())
        result["params"] = sum(p.numel() for p in params)
        result["bytes"] = sum(p.numel() * p.element_size() for p in params)
        result["tensors"] = len(params)
        context = SyncContext(
            inference_url=server.base_url,
            served_model_name=settings.served_model_name,
            checkpoint_dir=work / "checkpoints",
            backend="vllm",
        )
        strategy = VllmSharedSync(context)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        begin = time.perf_counter()
        strategy.attach(model)  # joins the NCCL group and sends once
        result["attach_s"] = time.perf_counter() - begin
        if strategy.zero_copy:
            raise RuntimeError("vLLM and the trainer share a GPU: this measures NCCL only")
        result["kernel_format"] = strategy._layout is not None
        formats = {"kernel": strategy._layout, "checkpoint": None}
        for fmt, layout in formats.items():
            if fmt == "kernel" and layout is None:
                continue
            strategy._layout = layout  # the benchmark compares both formats in one run
            times, phases = [], []
            for step in range(1, args.syncs + 1):
                with torch.no_grad():
                    for p in params:
                        p.add_(1e-3)  # new weights each time, as after an optimizer step
                torch.cuda.synchronize(device)
                outcome = strategy.sync(model, step)
                times.append(outcome.sync_time)
                phases.append(outcome.phases)
            result[f"{fmt}_sync_s"] = times
            result[f"{fmt}_phases"] = {
                k: statistics.median(p[k] for p in phases) for k in phases[0]
            }
        result["sync_extra_peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
        if args.variants:
            strategy._layout = formats["kernel"]
            result["variants"] = measure_variants(strategy, model, args, sparsity)
        result["served_after_sync"] = served_ok(server.base_url, settings.served_model_name)
    finally:
        server.stop(timeout=30)
        strategy = model = None  # the raw broadcast's ranks need this GPU's memory next
        torch.cuda.empty_cache()
    return result


def served_ok(base_url: str, model: str) -> bool:
    """vLLM still generates after the syncs (token-id prompt, no tokenizer)."""
    import httpx

    try:
        response = httpx.post(
            f"{base_url}/v1/completions",
            json={"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        return response.status_code == 200 and bool(response.json()["choices"])
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def _broadcast_rank(rank: int, shape: str, args: argparse.Namespace, port: int, box: Any) -> None:
    """One of two ranks timing ``broadcast`` from rank 0 on the two GPUs."""
    import torch
    import torch.distributed as dist
    from transformers import Qwen2ForCausalLM

    gpu = args.trainer_gpu if rank == 0 else args.vllm_gpu
    device = torch.device(f"cuda:{gpu}")
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, device_id=device
    )
    with torch.device("meta"):
        shapes = [p.shape for p in Qwen2ForCausalLM(qwen2_config(shape)).parameters()]
    tensors = [torch.empty(s, dtype=torch.bfloat16, device=device) for s in shapes]
    flat = torch.empty(sum(t.numel() for t in tensors), dtype=torch.bfloat16, device=device)

    def timed(fn: Any, repeats: int) -> list[float]:
        fn()  # warm-up (NCCL communicator set-up on the first call)
        out = []
        for _ in range(repeats):
            torch.cuda.synchronize(device)
            dist.barrier()
            begin = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            out.append(time.perf_counter() - begin)
        return out

    flat_s = timed(lambda: dist.broadcast(flat, src=0), args.syncs)
    per_s = timed(lambda: [dist.broadcast(t, src=0) for t in tensors], args.syncs)
    if rank == 0:
        box.put({"flat_s": flat_s, "per_tensor_s": per_s})
    dist.destroy_process_group()


def measure_broadcast(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    """Raw NCCL broadcast of the shape's bytes between the same two GPUs."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    box = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_broadcast_rank, args=(r, shape, args, port, box)) for r in range(2)
    ]
    for proc in procs:
        proc.start()
    result = box.get(timeout=300)
    for proc in procs:
        proc.join(60)
    return result


FORMATS = {"kernel": "vLLM's layout (direct copy)", "checkpoint": "checkpoint format (reload)"}


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| shape | params | bytes | sent as | shared_vllm sync median (min-max) | phases "
        "(median ms) | raw broadcast, one buffer | raw, per tensor | sync / raw | raw GB/s "
        "| sync GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['shape']} | error: {row['error'][:300]} |||||||||")
            continue
        flat = statistics.median(row["flat_s"])
        per = statistics.median(row["per_tensor_s"])
        for fmt, label in FORMATS.items():
            if f"{fmt}_sync_s" not in row:
                continue
            times = row[f"{fmt}_sync_s"]
            sync = statistics.median(times)
            phases = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in row[f"{fmt}_phases"].items())
            lines.append(
                f"| {row['shape']} | {row['params'] / 1e9:.2f} B | {row['bytes'] / GB:.2f} GB "
                f"| {label} | {sync * 1e3:.0f} ms ({min(times) * 1e3:.0f}-"
                f"{max(times) * 1e3:.0f}) | {phases} | {flat * 1e3:.1f} ms | {per * 1e3:.1f} ms "
                f"| {sync / flat:.1f}x | {row['bytes'] / flat / GB:.0f} | "
                f"{row['bytes'] / sync / GB:.0f} |"
            )
    return lines


def variant_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per measured variant (``--variants``), against the raw one-buffer broadcast."""
    out = []
    for row in rows:
        if not row.get("variants"):
            continue
        flat = statistics.median(row["flat_s"]) if row.get("flat_s") else None
        out += [
            f"### {row['shape']}: sync variants ({row['bytes'] / GB:.2f} GB in bf16; raw "
            f"one-buffer broadcast {flat * 1e3:.1f} ms)"
            if flat
            else f"### {row['shape']}",
            "",
            "bf16 elements changed by one AdamW step (float32 masters): "
            + ", ".join(f"lr {lr:g}: {f:.2%}" for lr, f in row.get("sparsity", {}).items()),
            "",
            "| variant | lr | sync median (min-max) | phases (median ms) | bytes sent | vs raw |",
            "|---|---|---|---|---|---|",
        ]
        for v in row["variants"]:
            if "error" in v:
                out.append(f"| {v['variant']} | {v['lr'] or '-'} | error: {v['error'][:200]} |||")
                continue
            times = v["sync_s"]
            sync = statistics.median(times)
            phases = ", ".join(f"{k} {t * 1e3:.0f}" for k, t in v["phases"].items())
            sent = v.get("bytes_sent", row["bytes"])
            out.append(
                f"| {v['variant']} | {v['lr'] or '-'} | {sync * 1e3:.0f} ms ({min(times) * 1e3:.0f}"
                f"-{max(times) * 1e3:.0f}) | {phases} | {sent / GB:.3f} GB | "
                f"{sync / flat:.1f}x |"
                if flat
                else "n/a |"
            )
        out.append("")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/nccl_sync_work"))
    parser.add_argument(
        "--shapes", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"]
    )
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--trainer-gpu", type=int, default=0)
    parser.add_argument("--vllm-gpu", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--start-timeout", type=float, default=240)
    parser.add_argument(
        "--variants", nargs="+", default=[], choices=[*VARIANTS, "all"],
        help="sync variants to measure after the plain syncs (issue 29)",
    )  # fmt: skip
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-6, 1e-5])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    for var in ("NCCL_NVLS_ENABLE",):
        if os.environ.get(var) != "0":
            print(f"nccl_sync: warning: {var} is not 0 in this environment", flush=True)
    rows = []
    for shape in args.shapes:
        row: dict[str, Any] = {"shape": shape}
        try:
            row = measure_sync(shape, args.work, args)
            print(f"nccl_sync: {shape} {row}", flush=True)
            row |= measure_broadcast(shape, args)
            print(f"nccl_sync: {shape} raw {row['flat_s']} / {row['per_tensor_s']}", flush=True)
        except Exception as error:  # one shape failing still reports the others
            row["error"] = f"{type(error).__name__}: {error}"
            print(f"nccl_sync: {shape} failed: {row['error']}", flush=True)
        rows.append(row)
    import torch

    facts = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    try:
        import vllm

        facts["vllm"] = vllm.__version__
    except ImportError:
        facts["vllm"] = "missing"
    text = "\n".join(
        [
            "# shared_vllm NCCL sync vs raw broadcast (trainer GPU "
            f"{args.trainer_gpu}, vLLM GPU {args.vllm_gpu})",
            "",
            ", ".join(f"{k} {v}" for k, v in facts.items()),
            f"{args.syncs} syncs per shape after the first (attach); bf16; random init.",
            "",
            *table(rows),
            "",
            *variant_table(rows),
        ]
    )
    (args.out / "nccl_sync.md").write_text(text)
    (args.out / "nccl_sync.json").write_text(json.dumps({"facts": facts, "rows": rows}, indent=1))
    print(text, flush=True)
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
