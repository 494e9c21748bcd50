"""Supervisor benchmark: start overhead, cost of heavy child output, event latency.

    python benchmarks/supervisor.py [--seconds 30] [--rate 20000]

1. Start-to-all-ready overhead: a chain api -> inference -> trainer of real HTTP children
   that each listen after a fixed delay. Overhead = time from run() to the last READY event
   minus the children's own time to listen (spawn -> listening, summed along the chain).
   Compared with polling readiness every 1 s (the `until curl; do sleep 1; done` habit).
2. Heavy output: 4 children print ``--rate`` lines/s in total for ``--seconds``; measures
   the supervisor's own CPU % and RSS, checks that the log files hold every line, and the
   latency child-write -> subscriber. Compared with a naive supervisor that reads with
   ``readline`` and publishes every line as its own event.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from grpo_tui.supervisor.events import LogBatch, State, StateChanged
from grpo_tui.supervisor.spec import HttpProbe, ProcessSpec
from grpo_tui.supervisor.supervisor import Supervisor

LISTENER = Path(__file__).parents[1] / "tests" / "supervisor" / "children" / "listener.py"
PRINTER = """
import sys, time
rate, seconds, tag = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
out = sys.stdout
start = time.monotonic()
sent = 0
while (now := time.monotonic()) - start < seconds:
    due = int((now - start) * rate)
    stamp = time.time()
    out.write("".join(f"{tag} {i} {stamp:.6f} payload-payload-payload-payload\\n"
                      for i in range(sent, due)))
    out.flush()
    sent = due
    time.sleep(0.005)
print(f"{tag} done {sent}", flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start_overhead(period: float, delay: float, run_dir: Path) -> float:
    names = ["api", "inference", "trainer"]
    ports = {name: free_port() for name in names}
    specs = []
    for index, name in enumerate(names):
        specs.append(
            ProcessSpec(
                name=name,
                command=[
                    sys.executable,
                    str(LISTENER),
                    "--port",
                    str(ports[name]),
                    "--delay",
                    str(delay),
                ],
                depends_on={names[index - 1]: {}} if index else {},
                readiness=HttpProbe(url=f"http://127.0.0.1:{ports[name]}/", period=period),
            )
        )
    sup = Supervisor(specs, run_dir)
    sub = sup.subscribe()
    began = time.time()
    runner = asyncio.create_task(sup.run())
    spawned: dict[str, float] = {}
    async for event in sub:
        if isinstance(event, StateChanged) and event.new == State.STARTING:
            spawned[event.process] = event.t
        if (
            isinstance(event, StateChanged)
            and event.process == "trainer"
            and event.new == State.READY
        ):
            all_ready = event.t
            break
    own = 0.0
    for name in names:
        listened = next(
            float(line.split()[-1])
            for line in sup.recent_lines(name)
            if line.startswith("listening")
        )
        own += listened - spawned[name]
    await sup.shutdown("benchmark")
    await runner
    sub.close()
    return (all_ready - began) - own


class Meter:
    """CPU % of one core and peak RSS of this process, sampled while a block runs."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak_rss = 0

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
            await asyncio.sleep(0.5)

    def cpu(self) -> float:
        times = self.proc.cpu_times()
        return times.user + times.system


def latency_stats(latencies: list[float]) -> str:
    if not latencies:
        return "-"
    ordered = sorted(latencies)
    p99 = ordered[int(0.99 * (len(ordered) - 1))]
    return f"p50 {statistics.median(ordered) * 1000:.0f} ms / p99 {p99 * 1000:.0f} ms"


def count_lines(logs: list[Path], per_child: list[int]) -> tuple[int, int]:
    """(lines found in order, lines expected) over the children's log files."""
    found = 0
    for path, expected in zip(logs, per_child, strict=True):
        index = 0
        for line in path.read_bytes().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] != b"done" and int(parts[1]) == index:
                index += 1
        found += min(index, expected)
    return found, sum(per_child)


def printers(rate: float, seconds: float) -> list[list[str]]:
    return [[sys.executable, "-c", PRINTER, str(rate / 4), str(seconds), f"c{i}"] for i in range(4)]


def expected_counts(logs: list[Path]) -> list[int]:
    counts = []
    for path in logs:
        last = path.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1].split()
        counts.append(int(last[2]) if len(last) == 3 and last[1] == b"done" else -1)
    return counts


async def heavy_output(rate: float, seconds: float, run_dir: Path) -> dict[str, str]:
    specs = [
        ProcessSpec(name=f"c{i}", command=cmd) for i, cmd in enumerate(printers(rate, seconds))
    ]
    sup = Supervisor(specs, run_dir)
    sub = sup.subscribe(max_pending=100_000)
    latencies: list[float] = []
    meter = Meter()
    stop = asyncio.Event()
    watcher = asyncio.create_task(meter.watch(stop))
    cpu0, t0 = meter.cpu(), time.monotonic()
    runner = asyncio.create_task(sup.run())

    async def consume() -> None:
        async for event in sub:
            if isinstance(event, LogBatch) and event.lines:
                now = time.time()
                for line in event.lines[:: max(1, len(event.lines) // 20)]:
                    parts = line.split()
                    if len(parts) == 4:
                        latencies.append(now - float(parts[2]))

    consumer = asyncio.create_task(consume())
    outcome = await runner
    cpu = (meter.cpu() - cpu0) / (time.monotonic() - t0) * 100
    stop.set()
    await watcher
    sub.close()
    await consumer
    logs = [run_dir / "logs" / f"c{i}.log" for i in range(4)]
    found, expected = count_lines(logs, expected_counts(logs))
    assert outcome.exit_code == 0, outcome
    return {
        "cpu": f"{cpu:.1f} %",
        "rss": f"{meter.peak_rss / 2**20:.0f} MB",
        "lost": f"{expected - found} of {expected}",
        "latency": latency_stats(latencies),
    }


async def naive_output(rate: float, seconds: float, run_dir: Path) -> dict[str, str]:
    """readline per line, one write and one queued event per line."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    queue: asyncio.Queue[tuple[float, str]] = asyncio.Queue()
    latencies: list[float] = []
    meter = Meter()
    stop = asyncio.Event()
    watcher = asyncio.create_task(meter.watch(stop))
    cpu0, t0 = meter.cpu(), time.monotonic()

    async def pump(index: int, cmd: list[str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        assert proc.stdout is not None
        with (run_dir / "logs" / f"c{index}.log").open("wb") as log:
            while line := await proc.stdout.readline():
                log.write(line)
                log.flush()
                queue.put_nowait((time.time(), line.decode(errors="replace")))
        await proc.wait()

    async def consume() -> None:
        count = 0
        while True:
            now, line = await queue.get()
            count += 1
            parts = line.split()
            if count % 20 == 0 and len(parts) == 4:
                latencies.append(now - float(parts[2]))

    consumer = asyncio.create_task(consume())
    await asyncio.gather(*(pump(i, cmd) for i, cmd in enumerate(printers(rate, seconds))))
    cpu = (meter.cpu() - cpu0) / (time.monotonic() - t0) * 100
    stop.set()
    await watcher
    consumer.cancel()
    logs = [run_dir / "logs" / f"c{i}.log" for i in range(4)]
    found, expected = count_lines(logs, expected_counts(logs))
    return {
        "cpu": f"{cpu:.1f} %",
        "rss": f"{meter.peak_rss / 2**20:.0f} MB",
        "lost": f"{expected - found} of {expected}",
        "latency": latency_stats(latencies),
    }


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20_000.0, help="lines/s, all children")
    parser.add_argument("--delay", type=float, default=0.5, help="each child's time to listen")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        root = Path(tmp)
        starts = {}
        for period in (0.05, 1.0):
            runs = [
                await start_overhead(period, args.delay, root / f"start-{period}-{r}")
                for r in range(args.repeats)
            ]
            starts[period] = statistics.median(runs) * 1000
        print("\nStart-to-all-ready overhead (3-process chain, median of", args.repeats, "runs)")
        print(
            table(
                [
                    ("readiness", "overhead beyond the chain", "target"),
                    ("grpo-tui, http probe every 50 ms", f"{starts[0.05]:.0f} ms", "< 200 ms"),
                    ("naive: poll every 1 s", f"{starts[1.0]:.0f} ms", ""),
                ]
            )
        )
        ours = await heavy_output(args.rate, args.seconds, root / "heavy")
        naive = await naive_output(args.rate, args.seconds, root / "naive")
    print(
        f"\nSupervisor cost while 4 children print {args.rate:.0f} lines/s in total "
        f"for {args.seconds:.0f} s"
    )
    print(
        table(
            [
                (
                    "approach",
                    "CPU (one core)",
                    "peak RSS",
                    "lines lost",
                    "child line -> subscriber",
                ),
                (
                    "grpo-tui (chunks, 50 ms batches)",
                    ours["cpu"],
                    ours["rss"],
                    ours["lost"],
                    ours["latency"],
                ),
                (
                    "naive (readline, event per line)",
                    naive["cpu"],
                    naive["rss"],
                    naive["lost"],
                    naive["latency"],
                ),
                ("target", "< 15 %", "< 150 MB", "0", ""),
            ]
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
