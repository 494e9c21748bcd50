"""Without NVML the GPU part of the samples is absent, and one quiet notice says why.

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
    assert notices[0].level == "debug", "every CPU run would print it"
    assert notices[0].message.startswith("GPU memory is not sampled: NVML is unavailable (")
    assert "ModuleNotFoundError" in notices[0].message and "pynvml" in notices[0].message
    assert not any(isinstance(e, Notice) for e in second), "the notice is published once"
    assert not any(isinstance(e, GpuSample) for e in first + second)


def test_the_nvml_notice_is_neither_printed_nor_shown() -> None:
    """A debug notice stays in events.jsonl: not on the console, not in the events pane."""
    import io

    from rich.console import Console

    from grpo_tui.headless import ConsoleReport
    from grpo_tui.run_state import SUPERVISOR_LOG, RunState

    out = io.StringIO()
    report = ConsoleReport(Console(file=out, width=200), echo_logs=False)
    state = RunState("run")
    for event in (
        Notice(level="debug", message="GPU memory is not sampled: NVML is unavailable (x)"),
        Notice(level="info", message="checkpoint written"),
    ):
        report.handle(event)
        state.apply(event)
    assert "NVML" not in out.getvalue() and "checkpoint written" in out.getvalue()
    shown = list(state.logs[SUPERVISOR_LOG].lines)
    assert len(shown) == 1 and "checkpoint written" in shown[0]
    assert len(state.notices) == 2
