"""The rollout inspector and the step timeline at scale, for ``benchmarks/tui.py``.

Builds a run directory with a 100,000-group rollout record (1,000 distinct quickstart-shaped
groups, 8 sequences of 14 tokens, written by the real writer, then repeated with shifted
offsets and steps: what a reader sees is the same as for 100,000 written ones) and a
timeline of 8 processes x 1,000 steps, opens the app headless on it (200x50) and times:

- the inspector's first open (reading the 100k-row index) and each group opened by a key
  press (wall time to the drawn frame; and the screen's own read + decode + draw time);
- the timeline's redraw (CPU time of the redraw and the frame it makes) at the default
  zoom (3 steps) and over all 1,000 steps, as its 2 Hz timer does it;
- the dashboard at 100x30 over a run of 1,000 steps (every chart's metrics, five processes
  and their samples, the API's queue gauges), a new step each time: the CPU time of one
  full redraw (header, table, all twelve charts, the frame), what its timers spread over
  half a second, and of one of its 1/8 s ticks (three charts).
"""

from __future__ import annotations

import asyncio
import math
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


def dashboard_state(steps: int):
    """A run of ``steps`` steps as the dashboard sees it: every chart's series, five
    processes with their samples, the supervisor's scrapes."""
    from grpo_tui.run_state import RunState
    from grpo_tui.supervisor.events import MetricsRecord, ResourceSample, State, StateChanged

    state = RunState("bench-20261129-000000", mode="shared_vllm", started_at=1.7e9)
    names = ("model", "api", "inference", "trainer", "env")
    for i, name in enumerate(names):
        state.process(name).role = name
        state.apply(
            StateChanged(t=1.7e9 + i, process=name, old=State.PENDING, new=State.READY, pid=100 + i)
        )
    for step in range(1, steps + 1):
        state.apply(step_record(step))
        t = 1.7e9 + 10 + step
        for name in names[1:]:
            state.apply(ResourceSample(t=t, process=name, cpu_percent=20.0, rss_bytes=2**28 + step))
        data = {"api/queue_groups": float(step % 7), "api/time_in_queue_s": 1.0 + step % 3}
        state.apply(MetricsRecord(t=t, process="supervisor", step=None, data=data))
        rate = {"inference/tokens_per_s": 900.0}
        state.apply(MetricsRecord(t=t, process="inference", step=None, data=rate))
    return state


def step_record(step: int):
    from grpo_tui.supervisor.events import MetricsRecord

    wave = math.sin(step / 7)
    data = {
        "loss": 0.5 / (1 + step / 100) + 0.01 * wave,
        "reward/mean": min(0.95, step / 1000),
        "mean_ratio": 1 + 0.03 * wave,
        "clipped_fraction": 0.1 + 0.02 * wave,
        "alignment/diff_abs_mean": 0.02,
        "alignment/diff_abs_mean_lag0": 0.002,
        "mismatch_kl": 0.004,
        "mismatch_kl/lag0": 0.0001,
        "staleness/lag0": 0.6,
        "staleness/lag1": 0.4,
        "off_policy_lag": 0.4,
        "tokens_per_s": 800.0,
        "sync_time": 0.3,
        "sync/split/pause_s": 0.02,
        "sync/split/transfer_s": 0.25,
        "sync/split/resume_s": 0.03,
        "training_steps": 2000.0,
        "phase/generating_s": 1.0,
        "phase/training_s": 0.5,
        "phase/syncing_s": 0.3,
    }
    return MetricsRecord(t=1.7e9 + 10 + step, process="trainer", step=step, data=data)


async def _measure_dashboard(steps: int, presses: int) -> dict[str, list[float]]:
    from grpo_tui.app import GrpoTuiApp
    from grpo_tui.screens.dashboard import CHARTS_PER_TICK, DashboardScreen

    class Control:  # the dashboard of a live run: its actions' keys on the bar
        run_dir = Path(tempfile.gettempdir())

    state = dashboard_state(steps)
    app = GrpoTuiApp(
        state, control=Control(), clock=lambda: 1.7e9 + 20 + steps, keymap_path=Path("/none")
    )
    out: dict[str, list[float]] = {"dashboard full redraw at 100x30, 1,000 steps, CPU": []}
    tick = f"dashboard one tick ({CHARTS_PER_TICK} charts) at 100x30, 1,000 steps, CPU"
    out[tick] = []
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, DashboardScreen)
        step = steps
        for _ in range(presses):
            step += 1
            state.apply(step_record(step))
            started = time.process_time()
            for _ in range(len(screen._charts) // CHARTS_PER_TICK):
                screen.redraw_next_charts()
            await pilot.pause()
            out["dashboard full redraw at 100x30, 1,000 steps, CPU"].append(
                time.process_time() - started
            )
            step += 1
            state.apply(step_record(step))
            started = time.process_time()
            screen.redraw_next_charts()
            await pilot.pause()
            out[tick].append(time.process_time() - started)
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
    results |= asyncio.run(_measure_dashboard(steps, presses))
    targets = {"open a group": "< 200", "timeline redraw": "< 30", "dashboard full": "< 30"}
    rows = []
    for name, values in results.items():
        ms = [v * 1000 for v in values]
        p90 = statistics.quantiles(ms, n=10)[-1] if len(ms) > 1 else ms[0]
        target = next((t for key, t in targets.items() if name.startswith(key)), "")
        rows.append((f"{name} ms median / p90", f"{statistics.median(ms):.1f} / {p90:.1f}", target))
    return rows
