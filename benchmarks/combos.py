"""Walks over the control surface, many of them: seeded, resumable, at most ``--jobs`` at once.

Each seed draws a walk (``tests/e2e/combo_walk.py``: a start mode, a checkpoint interval,
``--length`` actions among mode switches, inference and trainer restarts, SIGKILLs,
SIGSTOPs, live edits, an environment stopped and started) and plays it on a fresh CPU
quickstart stack (``tests/e2e/combo_play.py``), checked after every action. A failing
walk is shrunk (``--shrink`` replays at most) to a short one that still fails; its seed,
its walk and the shrunk walk are printed and kept. Results go to ``--results`` (one JSON
line a walk: run again and the seeds done are skipped), the table to stdout and to
``benchmarks/results/combos.md`` (between its markers; the findings log there is kept).

    nice -n 10 python benchmarks/combos.py --seeds 0:200 --jobs 2
    python benchmarks/combos.py --walk 'mode=shared_vllm ckpt=5 | switch:lora_only restart:trainer'
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "e2e"), str(REPO / "tests")]

from combo_play import Outcome, play, shrink  # noqa: E402
from combo_walk import Walk, draw  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
MARK_START = "<!-- combos-benchmark:start -->"
MARK_END = "<!-- combos-benchmark:end -->"
INVARIANTS = (
    "events",
    "give-up",
    "crash-loop",
    "steps",
    "lag0",
    "stall",
    "exit",
    "left-running",
    "queue",
    "control",
    "progress",
    "harness",
)


@dataclass(frozen=True)
class Done:
    """One seed's result, as stored."""

    seed: int
    walk: str
    ok: bool
    actions: int
    seconds: float
    invariants: list[str]
    violations: list[str]
    shrunk: str | None = None
    shrunk_violations: list[str] | None = None
    replays: int = 0
    transients: list[str] | None = None


def run_seed(seed: int, length: int, workdir: Path, budget: int, lock: threading.Lock) -> Done:
    walk = draw(seed, length)

    def say(line: str) -> None:
        with lock:
            print(f"[{seed}] {line}", flush=True)

    folder = workdir / f"seed-{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    outcome = play(walk, folder / "walk", say)
    shrunk: Outcome | None = None
    replays = 0
    if not outcome.ok and budget:
        shrunk, replays = shrink(outcome, folder, budget=budget, say=say)
    if outcome.ok:
        shutil.rmtree(folder, ignore_errors=True)  # keep the run directories of failures
    return Done(
        seed=seed,
        walk=str(walk),
        ok=outcome.ok,
        actions=outcome.actions_done,
        seconds=round(outcome.seconds, 1),
        invariants=sorted(outcome.invariants),
        violations=[str(v) for v in outcome.violations],
        shrunk=str(shrunk.walk) if shrunk else None,
        shrunk_violations=[str(v) for v in shrunk.violations] if shrunk else None,
        replays=replays,
        transients=outcome.transients,
    )


def load(path: Path) -> dict[int, Done]:
    if not path.is_file():
        return {}
    done = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = Done(**json.loads(line))
            done[record.seed] = record
    return done


def table(done: list[Done], *, length: int, wall: float | None) -> str:
    """The results as a Markdown table and the failures (seed, walk, shrunk walk)."""
    failed = [d for d in done if not d.ok]
    by_invariant = Counter(i for d in failed for i in d.invariants)
    rules = Counter(a.split(":")[0] for d in done for a in d.walk.split("|")[1].split())
    modes = Counter(d.walk.split()[0].removeprefix("mode=") for d in done)
    seconds = [d.seconds for d in done]
    rows = [
        "| sequences | actions played | failing sequences | walk time median / max (s) |",
        "|---|---|---|---|",
        f"| {len(done)} | {sum(d.actions for d in done)} (of {length} a walk) | {len(failed)} | "
        f"{statistics.median(seconds) if seconds else 0:.0f} / {max(seconds, default=0):.0f} |",
        "",
        "| invariant | failing sequences |",
        "|---|---|",
        *(f"| {name} | {by_invariant.get(name, 0)} |" for name in INVARIANTS),
        "",
        "Actions drawn: "
        + ", ".join(f"{k} {v}" for k, v in sorted(rules.items()))
        + "; start modes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(modes.items()))
        + ".",
    ]
    transient = [(d.seed, t) for d in done for t in d.transients or []]
    rows += [
        "",
        f"Lag-0 alignment off for a step or two after an action, back at float level within "
        f"its steps (allowed, told): {len(transient)} times in "
        f"{len({seed for seed, _ in transient})} walks.",
        *(f"- seed {seed}: {t}" for seed, t in transient),
    ]
    if wall is not None:
        rows.append(f"Wall time of this invocation: {wall / 60:.0f} min.")
    for d in failed:
        rows += ["", f"- seed {d.seed}: `{d.walk}`"]
        rows += [f"  - {v}" for v in d.violations]
        if d.shrunk:
            rows.append(f"  - shrunk ({d.replays} replays): `{d.shrunk}`")
            rows += [f"    - {v}" for v in d.shrunk_violations or []]
    return "\n".join(rows)


def write_markdown(path: Path, text: str) -> None:
    """Replace the benchmark's section of ``path`` (between the markers), or add it."""
    old = path.read_text() if path.is_file() else "# Combos\n"
    section = f"{MARK_START}\n{text}\n{MARK_END}"
    if MARK_START in old and MARK_END in old:
        head, _, rest = old.partition(MARK_START)
        _, _, tail = rest.partition(MARK_END)
        new = f"{head}{section}{tail}"
    else:
        new = f"{old.rstrip()}\n\n{section}\n"
    path.write_text(new)


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.node()}, {os.cpu_count()} cores, load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0:200", help="A:B, the seeds A .. B-1")
    parser.add_argument("--length", type=int, default=4, help="actions a walk")
    parser.add_argument("--jobs", type=int, default=2, help="walks at once (each a stack)")
    parser.add_argument("--shrink", type=int, default=8, help="replays to shrink a failure")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/grpo-combos"))
    parser.add_argument("--results", type=Path, default=RESULTS / "combos_runs.jsonl")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "combos.md")
    parser.add_argument("--walk", help="play this one walk (as a failure printed it)")
    parser.add_argument(
        "--report",
        action="store_true",
        help="play nothing: the table of the seeds stored (after a run cut short)",
    )
    args = parser.parse_args(argv)

    # The tests' guard, outside pytest: every process a walk starts carries this session's
    # tag, and a watchdog ends them when this script ends, however it ends.
    from process_guard import pytest_configure as guard

    guard(None)  # type: ignore[arg-type]  # it reads no configuration
    if args.walk:
        for folder in ("replay", "replay-shrink"):  # a replay before left its run there
            shutil.rmtree(args.workdir / folder, ignore_errors=True)
        outcome = play(Walk.parse(args.walk), args.workdir / "replay")
        if not outcome.ok and args.shrink:
            shrink(outcome, args.workdir / "replay-shrink", budget=args.shrink)
        return 0 if outcome.ok else 1

    first, _, last = args.seeds.partition(":")
    seeds = range(int(first), int(last))
    done = load(args.results)
    todo = [] if args.report else [s for s in seeds if s not in done]
    played = sum(1 for s in seeds if s in done)
    print(f"{played} of {len(seeds)} seeds played already; {len(todo)} to play")
    lock = threading.Lock()
    began = time.monotonic()
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(run_seed, s, args.length, args.workdir, args.shrink, lock) for s in todo
        ]
        for future in as_completed(futures):  # stored as each ends: a run cut short keeps it
            record = future.result()
            with lock, args.results.open("a") as out:
                out.write(json.dumps(record.__dict__) + "\n")
    results = [r for s, r in sorted(load(args.results).items()) if s in seeds]
    text = table(
        results, length=args.length, wall=None if args.report else time.monotonic() - began
    )
    text = f"Seeds {args.seeds} ({len(results)} played), {machine()}.\n\n{text}"
    print(text)
    write_markdown(args.markdown, text)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
