"""The rollout inspector and the step timeline at scale, for ``benchmarks/tui.py``.

Builds a run directory with a 100,000-group rollout record (1,000 distinct quickstart-shaped
groups, 8 sequences of 14 tokens, written by the real writer, then repeated with shifted
offsets and steps: what a reader sees is the same as for 100,000 written ones) and a
timeline of 8 processes x 1,000 steps, opens the app headless on it (200x50) and times:

- the inspector's first open (reading the 100k-row index) and each group opened by a key
  press (wall time to the drawn frame; and the screen's own read + decode + draw time);
- the timeline's redraw (CPU time of the redraw and the frame it makes) at the default
  zoom (3 steps) and over all 1,000 steps, as its 2 Hz timer does it.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from grpo_trainer.records.background import BackgroundWriter
from grpo_trainer.records.rollout_writer import ROLLOUTS_DIR, RolloutWriter
from grpo_trainer.records.rollouts import INDEX_DTYPE, GroupParts
from grpo_trainer.records.timeline import SpanRecorder

DISTINCT = 1_000
PHASES = (("wait", 0.30), ("forward_backward", 0.45), ("optimizer", 0.05), ("transfer", 0.1))


def _group(i: int) -> GroupParts:
    rng = np.random.default_rng(i)
    n, prompt, completion = 8, 8, 6
    trained = np.tile(np.r_[np.zeros(prompt, bool), np.ones(completion, bool)], n)
    inference = np.where(trained, -rng.random(len(trained)), np.nan).astype(np.float32)
    return GroupParts(
        kind="trained" if i % 5 else "dropped",
        step=i // 16 + 1,
        group=i % 16,
        env=("toy", "gsm8k")[i % 2],
        env_id=i % 2,
        version=i // 16,
        lag=int(rng.integers(0, 3)),
        t=1.7e9 + i,
        scores=rng.random(n).round(3).tolist(),
        advantages=rng.normal(size=n).tolist(),
        lengths=[prompt + completion] * n,
        arrays={
            "tokens": rng.integers(0, 50, len(trained)).astype(np.int32),
            "trained": trained,
            "inference_logprobs": inference,
            "trainer_logprobs": inference + 0.01,
            "entropy": np.where(trained, 1.0, np.nan).astype(np.float32),
            "ratio": np.where(trained, 1.01, np.nan).astype(np.float32),
        },
        prompt_text="repeat 7:",
        texts=["777777"] * n,
        pieces={t: chr(48 + t % 40) for t in range(50)},
    )


def write_record(run_dir: Path, groups: int) -> None:
    """``groups`` index rows over ``DISTINCT`` written records, repeated."""
    background = BackgroundWriter("bench")
    writer = RolloutWriter(run_dir, "trainer", max_mb=4096, background=background)
    writer.add(lambda: (_group(i) for i in range(DISTINCT)))
    background.close()
    writer.close()
    directory = run_dir / ROLLOUTS_DIR
    data_path, index_path = directory / "trainer.000000.data", directory / "trainer.000000.index"
    data, rows = data_path.read_bytes(), np.fromfile(index_path, INDEX_DTYPE)
    copies = -(-groups // DISTINCT)
    with data_path.open("ab") as data_out, index_path.open("ab") as index_out:
        for copy in range(1, copies):
            shifted = rows.copy()
            shifted["offset"] += copy * len(data)
            shifted["step"] += copy * (DISTINCT // 16 + 1)
            shifted["t"] += copy * DISTINCT
            data_out.write(data)
            index_out.write(shifted[: min(DISTINCT, groups - copy * DISTINCT)].tobytes())


def write_timeline(run_dir: Path, lanes: int, steps: int) -> None:
    background = BackgroundWriter("bench")
    recorders = [
        SpanRecorder(run_dir, f"trainer.rank{r}" if r else "trainer", "trainer", background)
        for r in range(lanes // 2)
    ] + [SpanRecorder(run_dir, f"env.{e}", "env", background) for e in range(lanes - lanes // 2)]
    for step in range(1, steps + 1):
        t = 1.7e9 + step
        for recorder in recorders:
            if recorder.role == "env":
                recorder.add("generate", t - 0.2, t + 0.7)
                recorder.add("room", t + 0.7, t + 0.95)
            else:
                at = t
                for phase, seconds in PHASES:
                    recorder.add(phase, at, at + seconds)
                    at += seconds
            recorder.flush(step)
        if step % 100 == 0:
            background.flush()
    background.close()
    for recorder in recorders:
        recorder.close()


async def _measure(run_dir: Path, presses: int) -> dict[str, list[float]]:
    from grpo_tui.app import GrpoTuiApp
    from grpo_tui.run_state import RunState
    from grpo_tui.screens.inspector import InspectorScreen
    from grpo_tui.screens.timeline import TimelineScreen

    app = GrpoTuiApp(RunState("bench", run_dir=run_dir), keymap_path=run_dir / "no-keymap")
    out: dict[str, list[float]] = {}
    async with app.run_test(size=(200, 50)) as pilot:
        started, cpu = time.perf_counter(), time.process_time()
        await pilot.press("g")
        await pilot.pause()
        inspector = app.screen
        assert isinstance(inspector, InspectorScreen) and inspector.record is not None
        out["inspector first open (reads the 100k-row index), wall"] = [
            time.perf_counter() - started
        ]
        out["inspector first open (reads the 100k-row index), CPU"] = [time.process_time() - cpu]
        assert len(inspector.index or []) >= 100_000
        walls, cpus, own = [], [], []
        for _ in range(presses):
            started, cpu = time.perf_counter(), time.process_time()
            await pilot.press("down")
            await pilot.pause()
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
            own.append(inspector.open_ms / 1000)
        out["open a group: key press to drawn frame, wall"] = walls
        out["open a group: key press to drawn frame, CPU"] = cpus
        out["open a group: read + decode + draw"] = own
        await pilot.press("t")
        await pilot.pause()
        timeline = app.screen
        assert isinstance(timeline, TimelineScreen)
        for label, keys in (("3 steps", ()), ("all 1,000 steps", ("a",))):
            for key in keys:
                await pilot.press(key)
            cpu = []
            for _ in range(presses):
                started = time.process_time()
                timeline.redraw(force=True)
                await pilot.pause()
                cpu.append(time.process_time() - started)
            out[f"timeline redraw CPU, {label}"] = cpu
    return out


def measure(
    groups: int = 100_000, lanes: int = 8, steps: int = 1000, presses: int = 20
) -> list[tuple[str, str, str]]:
    """Rows ``(measure, median / p90 ms, target)`` for ``benchmarks/tui.py``'s table."""
    with tempfile.TemporaryDirectory(prefix="grpo-tui-views-") as tmp:
        run_dir = Path(tmp)
        write_record(run_dir, groups)
        write_timeline(run_dir, lanes, steps)
        results = asyncio.run(_measure(run_dir, presses))
    targets = {"open a group": "< 200", "timeline redraw": "< 30"}
    rows = []
    for name, values in results.items():
        ms = [v * 1000 for v in values]
        p90 = statistics.quantiles(ms, n=10)[-1] if len(ms) > 1 else ms[0]
        target = next((t for key, t in targets.items() if name.startswith(key)), "")
        rows.append((f"{name} ms median / p90", f"{statistics.median(ms):.1f} / {p90:.1f}", target))
    return rows
