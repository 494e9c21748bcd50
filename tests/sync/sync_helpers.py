"""Helpers for the weight-sync tests: a real server per mode, a socket supervisor, probes."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch
from free_ports import free_port as free_port
from torch import nn

from grpo_trainer.serve.command_lines import inference_command
from grpo_trainer.serve.launch import ServerProcess
from grpo_trainer.serve.settings import InferenceSettings
from grpo_trainer.train.logprobs import naive_token_logprobs


class ModeServer:
    """The built-in server for one sync mode; ``restart`` relaunches it like the role layer.

    ``mode`` may carry ``none``'s reload after a colon (``none:restart``).
    """

    def __init__(self, mode: str, base_model: Path, run_dir: Path) -> None:
        self.mode, _, reload = mode.partition(":")
        self.base_model = str(base_model)
        self.run_dir = run_dir
        self.settings = InferenceSettings(port=free_port(), none_reload=reload or "in_place")
        self.process: ServerProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return self.settings.base_url

    def start(self, model: str | None = None, adapter: str | None = None) -> None:
        launch = inference_command(
            self.settings,
            mode=self.mode,
            model=model or self.base_model,
            adapter=adapter,
            shared_dir=str(self.run_dir / "shared_weights"),
        )
        self.starts += 1
        log = self.run_dir / "logs" / f"inference-{self.starts}.log"
        self.process = ServerProcess(launch, self.url, log)
        self.process.start()

    def restart(self, args: dict[str, Any]) -> None:
        self.stop()
        self.start(model=args.get("model"), adapter=args.get("lora_path"))

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


class SocketSupervisor:
    """A real Unix-socket peer speaking docs/control-socket.md: answers ``restart`` requests
    and keeps the events it is sent."""

    def __init__(self, path: Path, restart: Callable[[dict[str, Any]], None]) -> None:
        self.path = path
        self.requests: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        supervisor = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for raw in self.rfile:
                    record = json.loads(raw)
                    if record.get("type") == "event":
                        supervisor.events.append(record)
                    if record.get("type") != "request":
                        continue
                    supervisor.requests.append(record)
                    reply: dict[str, Any] = {"type": "reply", "id": record["id"], "result": {}}
                    try:
                        if record["action"] != "restart" or record.get("process") != "inference":
                            raise ValueError(f"unexpected request {record}")
                        restart(record["args"])
                        reply |= {"ok": True, "error": None}
                    except Exception as error:
                        reply |= {"ok": False, "error": str(error)}
                    self.wfile.write(json.dumps(reply).encode() + b"\n")
                    self.wfile.flush()

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def server_logprobs(url: str, model: str, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The server's logprobs of ``completion`` after ``prompt`` (echo, T = 1)."""
    body = {
        "model": model,
        "prompt": prompt + completion,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 0,
        "temperature": 1.0,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    values = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    return torch.tensor(values[len(prompt) :])


def trainer_logprobs(model: nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The trainer's current-policy logprobs of the same tokens (log_softmax(logits / 1))."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        out = naive_token_logprobs(model, ids, torch.ones_like(ids), torch.ones(1)).logprobs
    return out[0, len(prompt) - 1 :]


class VllmStandIn:
    """vLLM's weight-update endpoints as ``VllmSharedSync`` calls them, for a machine without
    vLLM: ``layout`` answers ``grpo_weight_layout`` and ``grpo_parameter_values``, and
    ``/start_weight_update`` is refused (400 with ``refusal``), as by a vLLM whose weight
    transfer engine is not ready. Every request's path is kept in ``paths``."""

    def __init__(self, layout: dict[str, torch.Tensor], refusal: str) -> None:
        self.paths: list[str] = []
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                path = self.path.split("?")[0]
                stand_in.paths.append(path)
                status, answer = 200, {}
                if path == "/start_weight_update":
                    status, answer = 400, {"error": {"message": refusal}}
                elif path == "/collective_rpc" and body["method"] == "grpo_weight_layout":
                    entries = [[n, list(t.shape), "float32"] for n, t in layout.items()]
                    answer = {"results": [entries]}
                elif path == "/collective_rpc" and body["method"] == "grpo_parameter_values":
                    answer = {"results": [layout[body["args"][0]].flatten().tolist()]}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
