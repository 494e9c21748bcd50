"""Dashboard cost under load, in a real terminal (tmux): CPU %, RSS, key-press latency.

Starts ``grpo-tui``'s app in a detached tmux session over a real Supervisor running four
children that print 20,000 lines/s in total and one child sending metrics at 10 Hz on the
control socket (set up as the ``grpo-tui`` command sets it up, Esc delay included). Then,
for ``--seconds`` (default 30), it samples the app process's CPU % and RSS (psutil; the
app process hosts the supervisor too, children not counted) on the dashboard and on the
logs screen, and times key presses from ``tmux send-keys`` to the screen change appearing
in ``tmux capture-pane`` (median and 90th percentile over ``--repeats`` round trips per
key). Prints a table against the targets (< 30 % of one core, < 250 MB, < 100 ms) and
writes the dashboard's capture-pane text to ``--capture`` (default: the benchmark's
temporary directory). The app runs with this process's ``PYTHONPATH``, so a checkout of
another commit can be measured with the same script.

Then the views at scale (``tui_views.py``, headless, 200x50): the rollout inspector over a
100,000-group record (first open; each group opened by a key press, target < 200 ms) and
the step timeline of 8 processes x 1,000 steps redrawn as its 2 Hz timer does (target
< 30 ms of CPU a redraw), and the dashboard at 100x30 over 1,000 steps (a full redraw of
what is on screen, target < 30 ms of CPU). ``--views-only`` runs only these (no tmux
needed).

    python benchmarks/tui.py [--seconds 30] [--lines-per-s 20000] [--repeats 20] [--views-only]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import tui_views

SESSION = "grpo-tui-bench"
DASHBOARD_MARK = "staleness"
LOGS_MARK = "trainer  supervisor"
PRINTER = """
import sys, time
rate, name = int(sys.argv[1]), sys.argv[2]
batch = max(1, rate // 100)
n = 0
next_t = time.monotonic()
while True:
    lines = (f"{name} line {n + i} lorem ipsum dolor sit amet\\n" for i in range(batch))
    sys.stdout.write("".join(lines))
    sys.stdout.flush()
    n += batch
    next_t += batch / rate
    time.sleep(max(0.0, next_t - time.monotonic()))
"""
METRICS = """
import json, math, os, socket, time
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["GRPO_TUI_SOCKET"])
print("grpo-trainer ready", flush=True)
step = 0
while True:
    step += 1
    data = {"loss": 1 / (1 + step / 50), "mean_ratio": 1 + 0.05 * math.sin(step / 10),
            "clipped_fraction": 0.1, "reward/mean": min(1, step / 600), "tokens_per_s": 900.0,
            "off_policy_lag": step % 3, "sync_time": 0.3, "training_steps": 100000,
            "alignment/diff_abs_mean": 0.02}
    rec = {"type": "metrics", "step": step, "t": time.time(), "data": data}
    sock.sendall((json.dumps(rec) + "\\n").encode())
    time.sleep(0.1)
"""


def app_script(workdir: Path, lines_per_s: int) -> Path:
    """A launcher for the app over a real Supervisor with the load children."""
    printer = workdir / "printer.py"
    printer.write_text(PRINTER)
    metrics = workdir / "metrics_child.py"
    metrics.write_text(METRICS)
    per_child = lines_per_s // 4
    launcher = workdir / "launch.py"
    launcher.write_text(
        f"""
import sys
from pathlib import Path
from grpo_tui.terminal import prefer_quick_escape
prefer_quick_escape()  # as the grpo-tui command does, before Textual is imported
from grpo_tui.app import GrpoTuiApp
from grpo_tui.run_state import RunState
from grpo_tui.supervisor.spec import ProcessSpec, LogLineProbe
from grpo_tui.stack.stack import GrpoStack
from grpo_tui.supervisor.supervisor import Supervisor
py = sys.executable
printer = {str(printer)!r}
specs = [
    ProcessSpec(name=f"printer{{i}}", role="env", command=[py, printer, "{per_child}", f"p{{i}}"])
    for i in range(4)
]
specs.append(ProcessSpec(name="trainer", role="trainer", command=[py, {str(metrics)!r}],
                         readiness=LogLineProbe(pattern="grpo-trainer ready")))
sup = Supervisor(specs, Path({str(workdir / "run")!r}))
code = GrpoTuiApp(RunState("bench", mode="none"), stack=GrpoStack(sup)).run()
sys.exit(code or 0)
"""
    )
    return launcher


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def capture() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def wait_screen(predicate: object, timeout: float = 20.0) -> float:
    """Seconds until ``predicate(capture())`` holds (polling every 10 ms)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate(capture()):  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.01)
    raise TimeoutError("screen never showed the expected change")


def app_pid(shell_pid: int) -> int:
    """The python process running the app (the pane's shell may exec it or fork it)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for proc in [psutil.Process(shell_pid), *psutil.Process(shell_pid).children(True)]:
            if "launch.py" in " ".join(proc.cmdline()):
                return proc.pid
        time.sleep(0.05)
    raise TimeoutError("app process not found")


def sample(proc: psutil.Process, seconds: float) -> tuple[float, float]:
    """Mean CPU % (of one core) and peak RSS (MB) over ``seconds``."""
    proc.cpu_percent(None)
    cpu, rss = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        cpu.append(proc.cpu_percent(None))
        rss.append(proc.memory_info().rss / 2**20)
    return statistics.mean(cpu), max(rss)


Measured = tuple[list[float], list[float]]
"""Wall ms and app CPU ms of each press of one key."""


class KeyTimer:
    """Times key presses: wall time to the screen change, and the app's CPU time for it.

    On a busy machine the wall time mostly measures waiting for a core; the CPU time (minus
    what the background load costs over the same interval) is what a key costs the app,
    i.e. its latency on an idle core.
    """

    def __init__(self, proc: psutil.Process, background_cpu_percent: float) -> None:
        self.proc = proc
        self.background = background_cpu_percent / 100

    def _cpu(self) -> float:
        times = self.proc.cpu_times()
        return times.user + times.system

    def press(self, key: str, done: object) -> tuple[float, float]:
        cpu = self._cpu()
        tmux("send-keys", "-t", SESSION, key)
        wall = wait_screen(done)
        cost = self._cpu() - cpu - self.background * wall
        return wall * 1000, max(0.0, cost) * 1000

    def round_trips(
        self, key: str, shows: str, back: str, repeats: int, *, toggle: bool = False
    ) -> tuple[Measured, Measured]:
        """``key`` until ``shows`` is on screen, ``back`` until it is gone (or the dashboard).

        Returns the (wall ms, app CPU ms) samples of ``key`` and of ``back``, apart: a round
        trip's two keys can cost very different amounts (Esc, for one, waits out ESCDELAY).
        """
        there: Measured = ([], [])
        back_again: Measured = ([], [])
        back_done = (
            (lambda text: shows not in text) if toggle else (lambda text: DASHBOARD_MARK in text)
        )
        for _ in range(repeats):
            for press, done, samples in (
                (key, lambda text: shows in text, there),
                (back, back_done, back_again),
            ):
                wall, cpu = self.press(press, done)
                samples[0].append(wall)
                samples[1].append(cpu)
        return there, back_again


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def latency_rows(name: str, measured: Measured) -> list[tuple[str, str, str]]:
    walls, cpus = measured
    return [
        (
            f"{name}: wall ms median / p90",
            f"{statistics.median(walls):.0f} / {p90(walls):.0f}",
            "< 100",
        ),
        (
            f"{name}: app CPU ms median / p90",
            f"{statistics.median(cpus):.0f} / {p90(cpus):.0f}",
            "",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--lines-per-s", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=20, help="round trips per key")
    parser.add_argument("--capture", type=Path, help="where to write the dashboard capture")
    parser.add_argument("--views-only", action="store_true", help="only the inspector/timeline")
    args = parser.parse_args()
    if args.views_only:
        print_rows(tui_views.measure(presses=args.repeats))
        return 0
    if shutil.which("tmux") is None:
        print("tmux is needed", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="grpo-tui-bench-"))
    capture_path = args.capture or workdir / "dashboard.txt"
    launcher = app_script(workdir, args.lines_per_s)
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    pythonpath = shlex.quote(os.environ.get("PYTHONPATH", ""))
    python = f"env PYTHONPATH={pythonpath} {shlex.quote(sys.executable)}"
    command = f"cd {shlex.quote(os.getcwd())} && exec {python} {launcher}"
    tmux("new-session", "-d", "-s", SESSION, "-x", "160", "-y", "48", command)
    try:
        shell = int(tmux("display-message", "-p", "-t", SESSION, "#{pane_pid}").strip())
        proc = psutil.Process(app_pid(shell))
        wait_screen(lambda text: "printer3" in text and "loss" in text)
        time.sleep(3)  # let the charts fill before sampling (the load is already on)
        half = args.seconds / 2
        dash_cpu, dash_rss = sample(proc, half)
        capture_path.write_text(capture())
        keys = KeyTimer(proc, dash_cpu)
        to_logs, to_dashboard = keys.round_trips("l", LOGS_MARK, "d", args.repeats)
        help_open, help_close = keys.round_trips(
            "?", "grpo-tui keys", "Escape", args.repeats, toggle=True
        )
        tmux("send-keys", "-t", SESSION, "l")
        wait_screen(lambda text: LOGS_MARK in text)
        logs_cpu, logs_rss = sample(proc, half)
        pause, follow = KeyTimer(proc, logs_cpu).round_trips(
            "f", "paused", "f", args.repeats, toggle=True
        )
        tmux("send-keys", "-t", SESSION, "d")
        wait_screen(lambda text: DASHBOARD_MARK in text)
        quit_start = time.monotonic()
        tmux("send-keys", "-t", SESSION, "q")
        wait_screen(lambda text: "Quit?" in text)
        tmux("send-keys", "-t", SESSION, "y")
        proc.wait(timeout=30)
        quit_s = time.monotonic() - quit_start
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        shutil.rmtree(workdir / "run", ignore_errors=True)  # ~1 MB of logs per second
    rows = [
        ("app CPU % of one core, dashboard", f"{dash_cpu:.1f}", "< 30"),
        ("app CPU % of one core, logs screen", f"{logs_cpu:.1f}", "< 30"),
        ("app RSS MB (peak)", f"{max(dash_rss, logs_rss):.0f}", "< 250"),
        *latency_rows("key l: dashboard -> logs", to_logs),
        *latency_rows("key d: logs -> dashboard", to_dashboard),
        *latency_rows("key ?: help opens", help_open),
        *latency_rows("key esc: help closes", help_close),
        *latency_rows("key f: logs pause", pause),
        *latency_rows("key f: logs follow", follow),
        ("quit -> every process stopped s", f"{quit_s:.1f}", ""),
    ]
    print(
        f"load: 4 children x {args.lines_per_s // 4} lines/s + metrics at 10 Hz, "
        f"{args.seconds:.0f} s, {args.repeats} round trips per key, cores: {psutil.cpu_count()}, "
        f"load avg {os.getloadavg()[0]:.1f}"
    )
    print_rows(rows + tui_views.measure(presses=args.repeats))
    print(f"dashboard capture: {capture_path}")
    return 0


def print_rows(rows: list[tuple[str, str, str]]) -> None:
    print(f"{'measure':<72} {'value':>13}  target")
    for name, value, target in rows:
        print(f"{name:<72} {value:>13}  {target}")


if __name__ == "__main__":
    sys.exit(main())
