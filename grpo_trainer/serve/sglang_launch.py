"""``python -m grpo_trainer.serve.sglang_launch ARGS``: SGLang's server with the run's token.

SGLang's ``--api-key`` guards every route but ``/health`` and ``/metrics``, its admin
routes (``/update_weights_from_disk``, ``/load_lora_adapter`` ...) included, but SGLang reads
it only from its command line, which ``ps`` shows to every user of the node. This adds it
from ``VLLM_API_KEY`` to the arguments SGLang parses (``sys.argv`` of this process; the
kernel's copy, ``/proc/PID/cmdline``, keeps the original) and runs
``sglang.launch_server`` as ``__main__``, exactly as ``python -m sglang.launch_server``.
"""

from __future__ import annotations

import os
import runpy
import sys

from grpo_trainer.serve.settings import API_KEY_ENV, SGLANG_MODULE


def main() -> None:
    key = os.environ.get(API_KEY_ENV)
    if not key:
        sys.exit(f"error: {API_KEY_ENV} is not set: refusing to serve without a token")
    sys.argv += ["--api-key", key]
    runpy.run_module(SGLANG_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
