"""The bearer-token guard vLLM loads with ``--middleware`` when it listens beyond loopback.

vLLM's own ``--api-key`` (``VLLM_API_KEY``) covers ``/v1/*`` only. With
``VLLM_SERVER_DEV_MODE=1`` (``shared_vllm``, ``colocate``, the LoRA modes) it also serves
``/pause``, ``/collective_rpc``, ``/sleep``, the weight-transfer routes and more, which on a
cluster would be open to the whole network. vLLM adds each ``--middleware`` class with
``app.add_middleware(cls)`` and no arguments, so this class takes the token from the
server's environment (``VLLM_API_KEY``, never its command line, which ``ps`` shows) and
guards every route but ``/health`` and ``/metrics``, as the built-in server does.
"""

from __future__ import annotations

import os

from starlette.types import ASGIApp

from grpo_trainer.api.security import SERVER_OPEN_PATHS, TokenGuard
from grpo_trainer.serve.settings import API_KEY_ENV


class EnvTokenGuard(TokenGuard):
    """:class:`TokenGuard` with ``$VLLM_API_KEY``; without one the server answers nothing."""

    def __init__(self, app: ASGIApp) -> None:
        token = os.environ.get(API_KEY_ENV)
        if not token:
            raise RuntimeError(
                f"{API_KEY_ENV} is not set: refusing to serve beyond loopback without a token"
            )
        super().__init__(app, token=token, open_paths=SERVER_OPEN_PATHS)
