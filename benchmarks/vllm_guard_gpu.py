"""GPU proof of vLLM's token guard: real vLLM, started by our command builder beyond loopback.

Builds the tiny model, starts ``vllm serve`` as a cluster run does (``host = "0.0.0.0"``,
mode ``shared_vllm``: dev mode on, ``--middleware grpo_trainer.sync.vllm_guard...``) with
``VLLM_API_KEY`` in its environment only, then checks each route with and without the
token and that no process of the server shows the token on its command line. Writes
``vllm_guard.md`` (one line per check) to ``--out``; exits 1 if any check fails.

Device call (after ``benchmarks/gpu_setup.sh`` can find the vLLM bundle, docs/gpu.md):
``bash benchmarks/vllm_guard_device.sh``
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path

import httpx
import psutil

from grpo_trainer.models import build_tiny_model
from grpo_trainer.serve.command_lines import VLLM_TOKEN_GUARD, inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.sync.client import InferenceClient

DEV_ROUTES = ("/pause", "/resume", "/reset_prefix_cache", "/collective_rpc")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/vllm_guard_work"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(args.work / "model", seed=0)
    settings = InferenceSettings(
        backend="vllm",
        host="0.0.0.0",
        port=free_port(),
        vllm_executable=[sys.executable, "-m", "vllm.entrypoints.cli.main"],
        enforce_eager=True,
        gpu_memory_utilization=0.2,
        max_model_len=256,
    )
    launch = inference_command(settings, mode="shared_vllm", model=str(model))
    token = secrets.token_urlsafe(24)
    launch = launch.model_copy(update={"env": {**launch.env, "VLLM_API_KEY": token}})
    url = f"http://{socket.gethostname()}:{settings.port}"
    server = ServerProcess(launch, url, args.work / "vllm.log")
    checks: list[tuple[str, bool]] = [("--middleware in argv", VLLM_TOKEN_GUARD in launch.argv)]
    try:
        server.start(timeout=300)
        with httpx.Client(base_url=url, timeout=30) as http:
            checks.append(("GET /health open", http.get("/health").status_code == 200))
            checks.append(("GET /metrics open", http.get("/metrics").status_code == 200))
            checks.append(("GET /v1/models 401", http.get("/v1/models").status_code == 401))
            for path in DEV_ROUTES:
                checks.append((f"POST {path} 401", http.post(path).status_code == 401))
        os.environ["VLLM_API_KEY"] = token  # as in a trainer's environment
        client = InferenceClient(url, attempts=1)  # our sync client: the token from env
        checks.append(("GET /v1/models with token", client.get("/v1/models").status_code == 200))
        paused = client.post("/pause", mode="wait").status_code == 200
        checks.append(("POST /pause with token", paused))
        checks.append(("POST /resume with token", client.post("/resume").status_code == 200))
        client.close()
        assert server.process is not None
        root = psutil.Process(server.process.pid)
        tree = [root, *root.children(recursive=True)]
        shown = " ".join(" ".join(p.cmdline()) for p in tree if p.is_running())
        checks.append((f"token on no command line ({len(tree)} processes)", token not in shown))
    except Exception as error:  # a failed start is a failed proof: say why
        checks.append((f"server: {' '.join(str(error).split())[:400]}", False))
    finally:
        server.stop()
    lines = [f"| {'ok' if ok else 'FAIL'} | {name} |" for name, ok in checks]
    report = "| | check |\n|---|---|\n" + "\n".join(lines) + "\n"
    (args.out / "vllm_guard.md").write_text(report)
    print(report)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
