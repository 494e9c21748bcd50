"""Without NVML the GPU part of the samples is absent, and one notice says why.

NVML's absence is forced the way a machine without nvidia-ml-py has it: ``import pynvml``
fails (``sys.modules`` holds None for it, in this process only).
"""

from __future__ import annotations

import sys

import httpx
import pytest

from grpo_tui.supervisor.events import GpuSample, Notice
from grpo_tui.supervisor.samplers import Samplers


async def test_without_nvml_one_notice_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    async with httpx.AsyncClient() as client:
        samplers = Samplers(client)
        first, _ = await samplers.sample({}, {})
        second, _ = await samplers.sample({}, {})
    notices = [e for e in first if isinstance(e, Notice)]
    assert len(notices) == 1, notices
    assert notices[0].message.startswith("GPU memory is not sampled: NVML is unavailable (")
    assert "ModuleNotFoundError" in notices[0].message and "pynvml" in notices[0].message
    assert not any(isinstance(e, Notice) for e in second), "the notice is published once"
    assert not any(isinstance(e, GpuSample) for e in first + second)
