"""Where vLLM's start-up goes, per phase, for the quickstart-gpu model and flag sets.

Each configuration starts the real ``vllm serve`` command our role layer builds for
``profiles/quickstart-gpu.toml`` (``inference_command``), with its own ``VLLM_CACHE_ROOT``
(fresh, or reused from an earlier configuration: a warm compile cache), waits for
``/health`` 200, times a generation burst shaped like the quickstart's (16 prompts x n 8,
6 new tokens; median of ``--bursts``), then stops the server's process group. vLLM's own
log lines give the phases: weight loading, Dynamo transform, Inductor compile (or cache
load), CUDA-graph capture, KV-cache set-up and the whole engine init; the rest of the time
to health is imports and process start. A separate probe times ``import`` of vLLM's API
server twice (the first without .pyc files when the bundle was installed ``--no-compile``).

    python benchmarks/vllm_startup.py --out OUT [--configs default,default,eager ...]

Writes ``vllm_startup.md`` and ``vllm_startup.json`` to ``--out``; vLLM's logs beside them.
Every wait is bounded (``--start-timeout`` per server, ``--budget`` for the whole run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.settings import InferenceSettings
from grpo_tui.plan.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "quickstart-gpu.toml"

PHASES = {
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) second",
    "dynamo_s": r"Dynamo bytecode transform time: ([\d.]+) s",
    "compile_total_s": r"torch\.compile and initial profiling/warmup run together took ([\d.]+) s",
    "compile_cache_load_s": r"Directly load the compiled graph\(s\).*?took ([\d.]+) s",
    "inductor_compile_s": r"Compiling a graph for compile range .*? takes ([\d.]+) s",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}

CAPABILITIES = {
    # every capability a run may switch to: LoRA slots, sleep mode, the worker extension and
    # weight transfer (the shared_vllm flags carry the last two)
    "lora": ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2"],
    "sleep": ["--enable-sleep-mode"],
}

CONFIGS: dict[str, dict[str, object]] = {
    # name: mode whose flags we start from, extra capabilities, eager, cache slot, capture sizes
    "default": {"mode": "shared_vllm"},
    "eager": {"mode": "shared_vllm", "eager": True},
    "all": {"mode": "shared_vllm", "caps": ["lora", "sleep"]},
    "all-eager": {"mode": "shared_vllm", "caps": ["lora", "sleep"], "eager": True},
    "all-small-graphs": {
        "mode": "shared_vllm",
        "caps": ["lora", "sleep"],
        "compilation": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128]},
    },
    "lora_only": {"mode": "lora_only"},
}


@dataclass
class Start:
    config: str
    cache: str
    health_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    burst_s: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    error: str | None = None


def vllm_cli() -> list[str]:
    if shutil.which("vllm"):
        return ["vllm"]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def build_model(work: Path) -> Path:
    profile = load_profile(PROFILE)
    model = work / "model"
    if not (model / "config.json").exists():
        flags = profile.run.tiny.flags()
        subprocess.run(
            [sys.executable, "-m", "grpo_trainer.tiny_model", "build", str(model), *flags],
            check=True,
            timeout=300,
        )
    return model


def command(name: str, model: Path, port: int, gpu: int) -> tuple[list[str], dict[str, str]]:
    spec = CONFIGS[name]
    profile = load_profile(PROFILE)
    table = dict(profile.table("inference") or {})
    table.pop("gpus", None)
    table.update(port=port, vllm_executable=vllm_cli())
    settings = InferenceSettings.model_validate(table)
    launch = inference_command(settings, mode=str(spec["mode"]), model=str(model))
    argv = list(launch.argv)
    env = dict(launch.env)
    for cap in spec.get("caps", []):  # type: ignore[union-attr]
        argv += [flag for flag in CAPABILITIES[str(cap)] if flag not in argv]
        if cap == "lora":
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    if spec.get("eager") and "--enforce-eager" not in argv:
        argv.append("--enforce-eager")
    if "compilation" in spec:
        argv += ["--compilation-config", json.dumps(spec["compilation"])]
    env.update(CUDA_VISIBLE_DEVICES=str(gpu), VLLM_SERVER_DEV_MODE="1")
    return argv, env


def phases_of(log: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, pattern in PHASES.items():
        values = [float(v) for v in re.findall(pattern, log)]
        if values:
            found[key] = round(sum(values), 2)
    return found


def burst(client: httpx.Client, url: str, model: str, prompts: int) -> tuple[float, int]:
    body = {
        "model": model,
        "prompt": [[3, 4, 5, 6, 7, 8, 9, 10]] * prompts,
        "n": 8,
        "max_tokens": 6,
        "temperature": 1.0,
        "logprobs": 0,
    }
    start = time.perf_counter()
    reply = client.post(f"{url}/v1/completions", json=body, timeout=60)
    reply.raise_for_status()
    tokens = reply.json()["usage"]["completion_tokens"]
    return time.perf_counter() - start, tokens


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the server's process group (it is ours: started with a new session)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def start_one(
    name: str, cache: Path, work: Path, model: Path, args: argparse.Namespace, deadline: float
) -> Start:
    result = Start(config=name, cache=cache.name)
    argv, env = command(name, model, args.port, args.gpu)
    log_path = work / f"vllm-{name}-{len(list(work.glob(f'vllm-{name}-*.log')))}.log"
    env = {
        **os.environ,
        **env,
        **dict(e.split("=", 1) for e in args.env),
        "VLLM_CACHE_ROOT": str(cache),
    }
    print(f"[{time.strftime('%H:%M:%S')}] {name} (cache {cache.name}): {' '.join(argv)}")
    t0 = time.perf_counter()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{args.port}"
    try:
        with httpx.Client(trust_env=False) as client:
            limit = min(t0 + args.start_timeout, deadline)
            while time.perf_counter() < limit:
                if proc.poll() is not None:
                    result.error = f"exited with {proc.returncode} before /health"
                    break
                try:
                    if client.get(f"{url}/health", timeout=1).status_code == 200:
                        result.health_s = round(time.perf_counter() - t0, 2)
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                result.error = f"no /health 200 within {limit - t0:.0f} s"
            if result.health_s is not None:
                served = argv[argv.index("--served-model-name") + 1]
                burst(client, url, served, 16)  # warm-up
                tokens = 0
                for _ in range(args.bursts):
                    seconds, count = burst(client, url, served, 16)
                    result.burst_s.append(round(seconds, 4))
                    tokens += count
                result.tokens_per_s = round(tokens / sum(result.burst_s), 1)
    except httpx.HTTPError as error:
        result.error = f"generation failed: {error}"
    finally:
        stop(proc)
    result.phases = phases_of(log_path.read_text(errors="replace"))
    print(f"  -> {json.dumps(asdict(result))}", flush=True)
    return result


def import_times() -> list[float]:
    code = "import time; t = time.perf_counter(); import vllm.entrypoints.openai.api_server; "
    code += "print(time.perf_counter() - t)"
    times = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=240
        )
        lines = done.stdout.strip().splitlines()
        times.append(round(float(lines[-1]), 2) if done.returncode == 0 and lines else -1.0)
    return times


def table(starts: list[Start], imports: list[float]) -> str:
    keys = list(PHASES)
    head = ["config", "cache", "to /health s", *keys, "burst ms (median)", "tok/s", "error"]
    lines = [
        f"vLLM import of the API server: first {imports[0]} s, second {imports[1]} s",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for s in starts:
        median = f"{statistics.median(s.burst_s) * 1000:.1f}" if s.burst_s else "-"
        cells = [s.config, s.cache, str(s.health_s), *(str(s.phases.get(k, "-")) for k in keys)]
        cells += [median, str(s.tokens_per_s), s.error or ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/vllm_startup"))
    parser.add_argument(
        "--configs",
        default="default@a,default@a,eager@b,all@c,all@c,all-eager@d,all-small-graphs@e,"
        "lora_only@f,lora_only@f",
        help="comma-separated name@cache; the same cache slot again = a warm compile cache",
    )
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every server")
    parser.add_argument("--port", type=int, default=24900)
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--start-timeout", type=float, default=200)
    parser.add_argument("--budget", type=float, default=540)
    args = parser.parse_args()
    deadline = time.perf_counter() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    imports = import_times()
    print(f"imports: {imports}", flush=True)
    model = build_model(args.work)
    starts: list[Start] = []
    for item in args.configs.split(","):
        name, _, slot = item.partition("@")
        if time.perf_counter() + 60 > deadline:
            starts.append(Start(config=name, cache=slot, error="skipped: budget spent"))
            continue
        cache = args.work / f"cache-{slot or name}"
        starts.append(start_one(name, cache, args.work, model, args, deadline))
        (args.out / "vllm_startup.json").write_text(
            json.dumps({"imports": imports, "starts": [asdict(s) for s in starts]}, indent=1)
        )
        (args.out / "vllm_startup.md").write_text(table(starts, imports))
    print(table(starts, imports))


if __name__ == "__main__":
    main()
