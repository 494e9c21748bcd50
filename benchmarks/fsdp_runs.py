"""A 2-rank FSDP2 trainer under ``grpo-tui run`` on two GPUs: a killed rank, and a reshard.

1. **Kill and resume.** ``shared_vllm`` with the trainer on GPUs 0 and 1 (torchrun, 2
   ranks) and vLLM on GPU 1 (NCCL from rank 0). Once a checkpoint at step >= ``--kill-after``
   exists, rank 1's worker (and only it) gets SIGKILL. Expected: torchrun takes the group
   down, the supervisor restarts the trainer, which resumes from its last checkpoint and
   trains on to the last step; the run exits 0 and leaves no process behind.
2. **2 ranks -> 1 rank.** A new run with the trainer on GPU 0 alone resumes from the
   2-rank run's last checkpoint (``resume = PATH``: torch DCP reshards it) and trains
   ``--extra-steps`` more steps.

Same settings as ``gpu_modes.py --layout fsdp2`` (its profile builder is reused).

    python benchmarks/fsdp_runs.py --out $OUT --budget 400
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_modes as gm
import psutil
import tomli_w

from grpo_trainer.train.resume import RESUMED
from grpo_trainer.weight_dirs.layout import list_checkpoints


def events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in gm._lines(run_dir / "events.jsonl") if kind is None or e["type"] == kind]


def trainer_steps(run_dir: Path, since: float = 0.0) -> list[int]:
    """Steps of the trainer's metrics records at or after ``since`` (wall time)."""
    records = gm._lines(run_dir / "metrics.jsonl")
    return [
        int(r["step"])
        for r in records
        if r.get("process") == "trainer"
        and r.get("step") is not None
        and r["t"] >= since
        and "reward/mean" in r.get("data", {})
    ]


def resumes(run_dir: Path) -> list[tuple[str, int]]:
    found = []
    for event in events(run_dir, "Notice"):
        if event.get("code") == RESUMED:
            found.append((event["data"]["checkpoint"], int(event["data"]["step"])))
    return found


def run_dir_of(cell_dir: Path) -> Path | None:
    runs = sorted((cell_dir / "runs").glob("*/")) if (cell_dir / "runs").is_dir() else []
    return runs[-1] if runs else None


def supervise(
    body: dict[str, Any], cell_dir: Path, deadline: float, during: Any = None
) -> tuple[int | None, Path | None, str]:
    """``grpo-tui run`` on ``body`` until it exits or ``deadline``; ``during(run_dir)`` is
    polled each second while it runs. Returns (exit code, run dir, run id)."""
    cell_dir.mkdir(parents=True, exist_ok=True)
    profile = cell_dir / "profile.toml"
    profile.write_text(tomli_w.dumps(body))
    command = [sys.executable, "-m", "grpo_tui", "run", str(profile), "--json"]
    run_id = ""
    with (
        (cell_dir / "supervisor.jsonl").open("wb") as out,
        (cell_dir / "supervisor.err").open("wb") as err,
    ):
        proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=gm.REPO, env=gm.child_env())
        supervisor = psutil.Process(proc.pid)
        while proc.poll() is None:
            run_id = run_id or gm.run_id_of(supervisor)
            run_dir = run_dir_of(cell_dir)
            if during is not None and run_dir is not None and during(run_dir):
                during = None
            if time.monotonic() > deadline:
                gm.stop(proc, grace=25)
                break
            time.sleep(1.0)
        code = proc.wait()
    return code, run_dir_of(cell_dir), run_id


def rank_worker(trainer_pid: int, rank: int) -> psutil.Process | None:
    """The torchrun worker of ``rank`` under the agent ``trainer_pid`` (by its RANK env)."""
    for child in psutil.Process(trainer_pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    return None


def kill_and_resume(args: argparse.Namespace, model: str, deadline: float) -> dict[str, Any]:
    report: dict[str, Any] = {"stage": "kill rank 1, resume", "passed": False}
    cell = gm.Cell(
        "vllm", "shared_vllm", "cuda", args.dtype, model, args.steps, 1, args.lr, "fsdp2"
    )
    ports = tuple(gm.free_ports(2, first=gm.PORT_BASE + 100))
    body = gm.profile_for(cell, ports=ports, output_dir=args.work / "kill" / "runs", args=args)
    body["run"]["name"] = "fsdp2-kill"
    body["trainer"] |= {"checkpoint_interval": args.checkpoint_interval, "keep_checkpoints": 3}
    killed: dict[str, Any] = {}

    def kill_rank_one(run_dir: Path) -> bool:
        done = [c.step for c in list_checkpoints(run_dir / "checkpoints")]
        if not done or max(done) < args.kill_after:
            return False
        spawned = [
            int(e["pid"])
            for e in events(run_dir, "StateChanged")
            if e["process"] == "trainer" and e["new"] == "starting" and e.get("pid") is not None
        ]
        worker = rank_worker(spawned[-1], 1) if spawned else None
        if worker is None:
            return False
        killed.update(pid=worker.pid, at=time.time(), checkpoint_on_disk=max(done))
        os.kill(worker.pid, signal.SIGKILL)
        return True

    code, run_dir, run_id = supervise(body, args.work / "kill", deadline, kill_rank_one)
    report |= {"exit_code": code, "run_dir": str(run_dir), "killed": killed}
    report["leftovers"] = gm.sweep(run_id, wait=15.0)
    if run_dir is None:
        return report
    report["restarts"] = [
        e.get("process") for e in events(run_dir, "Restarting") if e.get("process") == "trainer"
    ]
    report["resumes"] = resumes(run_dir)
    before = trainer_steps(run_dir)
    after = trainer_steps(run_dir, since=killed.get("at", float("inf")))
    report["steps_before_kill"] = before[: len(before) - len(after)]
    report["steps_after_kill"] = after
    result = gm.CellResult.of(cell)
    gm.read_run(result, args.work / "kill")
    report["reward_first_last"] = gm.reward_change(result, 3, 0.05)[0]
    report["sync_median_s"] = gm._median(result.sync_times)
    resumed_at = report["resumes"][-1][1] if report["resumes"] else None
    report["passed"] = bool(
        code == 0
        and killed
        and report["restarts"]
        and resumed_at is not None
        and resumed_at >= killed["checkpoint_on_disk"]
        and after == list(range(resumed_at + 1, args.steps + 1))
        and not report["leftovers"]
    )
    checkpoints = list_checkpoints(run_dir / "checkpoints")
    report["last_checkpoint"] = str(checkpoints[-1].path) if checkpoints else None
    report["last_step"] = checkpoints[-1].step if checkpoints else None
    return report


def reshard(
    args: argparse.Namespace, model: str, source: dict[str, Any], deadline: float
) -> dict[str, Any]:
    report: dict[str, Any] = {"stage": "2-rank checkpoint -> 1 rank", "passed": False}
    if not source.get("last_checkpoint"):
        report["reason"] = "no 2-rank checkpoint to resume from"
        return report
    start, extra = int(source["last_step"]), args.extra_steps
    cell = gm.Cell(
        "vllm", "shared_vllm", "cuda", args.dtype, model, start + extra, 1, args.lr, "split"
    )
    ports = tuple(gm.free_ports(2, first=gm.PORT_BASE + 200))
    one_rank = argparse.Namespace(**{**vars(args), "layout": "split"})
    body = gm.profile_for(cell, ports=ports, output_dir=args.work / "one" / "runs", args=one_rank)
    body["run"]["name"] = "fsdp1-resume"
    body["trainer"]["resume"] = source["last_checkpoint"]
    code, run_dir, run_id = supervise(body, args.work / "one", deadline)
    report |= {"exit_code": code, "run_dir": str(run_dir), "from": source["last_checkpoint"]}
    report["leftovers"] = gm.sweep(run_id, wait=15.0)
    if run_dir is None:
        return report
    report["resumes"] = resumes(run_dir)
    report["steps"] = trainer_steps(run_dir)
    report["passed"] = bool(
        code == 0
        and report["resumes"]
        and report["resumes"][0][1] == start
        and report["steps"] == list(range(start + 1, start + extra + 1))
    )
    return report


def diagnostics(reports: list[dict[str, Any]]) -> str:
    """The first error and the tail of every log of each stage that did not pass: the
    run directories stay on the device, so this is all the evidence that comes back."""
    out = ["# Diagnostics of the stages that did not pass", ""]
    for report in reports:
        if report["passed"] or not report.get("run_dir"):
            continue
        out += [f"## {report['stage']}", ""]
        run_dir = Path(report["run_dir"])
        errors = [e for e in events(run_dir) if e.get("level") in ("error", "warning")]
        out += [f"- event: {json.dumps(e)}" for e in errors[:20]]
        logs = sorted(run_dir.glob("logs/**/*.log"))
        for path in [run_dir.parent.parent / "supervisor.err", *logs]:
            out += [f"### {path.name}", "```", gm.first_errors(path, 60), "...", gm.tail(path, 40)]
            out += ["```", ""]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/fsdp_runs_work"))
    parser.add_argument("--budget", type=float, default=400.0)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--checkpoint-interval", type=int, default=4)
    parser.add_argument("--kill-after", type=int, default=8)
    parser.add_argument("--extra-steps", type=int, default=4)
    own, rest = parser.parse_known_args(argv)
    args = gm.parse_args(["--out", str(own.out), "--layout", "fsdp2", *rest])
    args.__dict__.update(vars(own))
    args.parallel = 1
    began = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    model, _ = gm.build_model(args.work / "model", gm.GPU_SHAPE)
    share = (args.budget - 20) / 2
    first = kill_and_resume(args, str(model), began + share)
    print(f"fsdp_runs: {json.dumps(first)}", flush=True)
    second = reshard(args, str(model), first, began + args.budget - 20)
    print(f"fsdp_runs: {json.dumps(second)}", flush=True)
    lines = [
        "# 2-rank FSDP2 trainer under grpo-tui run: killed rank, resume, reshard",
        "",
        f"{gm.facts(args)}",
        "",
        "| stage | passed | details |",
        "|---|---|---|",
    ]
    for report in (first, second):
        details = {k: v for k, v in report.items() if k not in ("stage", "passed")}
        lines.append(f"| {report['stage']} | {report['passed']} | `{json.dumps(details)}` |")
    text = "\n".join([*lines, ""])
    (args.out / "fsdp_runs.md").write_text(text)
    (args.out / "fsdp_runs_diagnostics.md").write_text(diagnostics([first, second]))
    print(text, flush=True)
    return 0 if first["passed"] and second["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
