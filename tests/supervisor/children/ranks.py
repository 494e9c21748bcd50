"""Test child: one rank of a trainer-like torchrun group on gloo. Usage: ranks.py STATE_DIR.

Like the trainer: prints ``grpo-trainer ready``, trains "steps" (a gloo all-reduce each), and
on SIGTERM finishes the step, checkpoints and exits 0. The ranks agree on stopping (an
all-reduce of the stop flag at every step boundary), so every rank stops after the same
step. Rank 0 checkpoints the step reached into ``STATE_DIR/ckpt`` every 2 steps and at the
stop; a start resumes from it. ``STATE_DIR/crash`` holding ``RANK STEP`` makes that rank
exit 3 at that step, once (the file is removed first). Each rank records ``pid ppid`` (its torchrun)
as a line of ``STATE_DIR/pids.RANK``.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

state = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
with open(state / f"pids.{rank}", "a") as pids:
    pids.write(f"{os.getpid()} {os.getppid()}\n")
checkpoint = state / "ckpt"
step = int(checkpoint.read_text()) if checkpoint.exists() else 0
stop = False


def request_stop(signum: int, frame: object) -> None:
    global stop
    stop = True


signal.signal(signal.SIGTERM, request_stop)
print(f"resumed at step {step}", flush=True)
print("grpo-trainer ready", flush=True)


def save() -> None:
    if rank == 0:
        checkpoint.with_suffix(".tmp").write_text(str(step))
        checkpoint.with_suffix(".tmp").replace(checkpoint)


while True:
    crash = state / "crash"
    if crash.exists() and crash.read_text().split() == [str(rank), str(step)]:
        crash.unlink()
        print(f"crashing at step {step}", flush=True)
        os._exit(3)
    flag = torch.tensor([1.0 if stop else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        save()
        print(f"stopped after step {step}, saved", flush=True)
        break
    time.sleep(0.1)
    step += 1
    print(f"step {step}", flush=True)
    if step % 2 == 0:
        save()
dist.destroy_process_group()
