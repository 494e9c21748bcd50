"""atroposlib's own environment client code, run against our rollout API.

Runs inside a venv that holds atroposlib (never the project's environment):

    /tmp/atropos-venv/bin/python benchmarks/api_atropos_client.py http://127.0.0.1:8000

It calls ``BaseEnv``'s registration, gzip posting (one group and a list) and
``/status-env`` methods, unbound, on a minimal stand-in for the environment object, so the
HTTP requests are exactly the ones an Atropos environment sends. The API must be fresh
(``GET /reset_data``). Prints ``ok ...`` or raises.
"""

from __future__ import annotations

import asyncio
import sys
import types

import requests
from atroposlib.envs.base import BaseEnv

GROUP = {
    "tokens": [[1, 2, 3, 4] * 100] * 4,
    "masks": [[-100, 2, 3, 4] * 100] * 4,
    "scores": [1.0, 0.0, 1.0, 0.0],
    "inference_logprobs": [[1.0, -0.5, -0.5, -0.5] * 100] * 4,
}


async def check(url: str) -> str:
    trainer = {
        "wandb_group": "",
        "wandb_project": "",
        "batch_size": 8,
        "max_token_len": 512,
        "checkpoint_dir": "",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": 10,
    }
    requests.post(f"{url}/register", json=trainer, timeout=30).raise_for_status()
    weights: list[float] = []

    async def update_weight(weight: float) -> None:
        weights.append(weight)

    config = types.SimpleNamespace(
        rollout_server_url=url,
        max_token_length=512,
        wandb_name="atropos_env",
        inference_weight=-1.0,
        min_batch_allocation=None,
        group_size=4,
        max_num_workers=1,
    )
    env = types.SimpleNamespace(
        config=config, server=types.SimpleNamespace(servers=[1], update_weight=update_weight)
    )
    env._post_json_with_compression = lambda *a, **k: BaseEnv._post_json_with_compression(
        env, *a, **k
    )
    # __wrapped__: the methods without tenacity's retries, so that a failure shows at once.
    waiting = await BaseEnv._register_env.__wrapped__(env)
    assert waiting == {"status": "wait for trainer to start"}, waiting
    assert requests.get(f"{url}/batch", timeout=30).json() == {"batch": None}
    registered = await BaseEnv._register_env.__wrapped__(env)
    assert registered["status"] == "success", registered
    env.env_id = registered["env_id"]

    await BaseEnv._send_scored_data_to_api.__wrapped__(env, dict(GROUP))
    await BaseEnv._send_scored_data_to_api.__wrapped__(env, [dict(GROUP)])
    await BaseEnv.get_status.__wrapped__(env)
    status = env.status_dict
    assert (status["queue_size"], status["self_queue_size"]) == (2, 2), status

    batch = requests.get(f"{url}/batch", timeout=30).json()["batch"]
    assert [g["env_id"] for g in batch] == [env.env_id] * 2, batch
    assert batch[0]["tokens"] == GROUP["tokens"]
    return f"ok: registered {registered['wandb_name']}, 2 gzip posts queued and served"


if __name__ == "__main__":
    print(asyncio.run(check(sys.argv[1])))
